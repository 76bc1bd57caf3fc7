"""Machine-written benchmark results: one JSON Lines file per benchmark kind in this folder.

A benchmark script appends one record per measured value:

    import sys; sys.path.insert(0, "benchmarks/results")        # or the path relative to the script
    from record import append_result, new_run_id

    run = new_run_id()                                           # one id for every record of this run
    append_result("memory-compare", {"run": run, "model": "smollm2-135m", "budget": "25%", "budget_mb": 33,
                                     "config": "flash", "metric": "decode_tok_s", "value": 31.9,
                                     "unit": "tok/s", "rounds": 8, "command": " ".join(sys.argv)})

The schema is in README.md. Standard library only.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import re
from pathlib import Path

RESULTS_DIR = Path(__file__).resolve().parent

# Field order in the files; every other key is refused so that records stay comparable.
FIELDS = ("benchmark", "run", "date", "model", "budget", "budget_mb", "config", "metric", "value", "low",
          "high", "unit", "rounds", "command", "notes")
REQUIRED = ("run", "metric", "value")
_KIND = re.compile(r"^[a-z0-9][a-z0-9-]*$")


def new_run_id(now: _dt.datetime | None = None) -> str:
    """A run id from the current UTC time, e.g. '2026-11-25T18:30:05Z'; sorts in time order."""
    now = now or _dt.datetime.now(_dt.timezone.utc)
    return now.strftime("%Y-%m-%dT%H:%M:%SZ")


def results_path(kind: str, results_dir: Path | str | None = None) -> Path:
    if not _KIND.match(kind):
        raise ValueError(f"kind = {kind!r}: use lower-case letters, digits and '-' (e.g. 'memory-compare')")
    return Path(results_dir or RESULTS_DIR) / f"{kind}.jsonl"


def normalize(kind: str, record: dict) -> dict:
    """The record as it is stored: checked, `benchmark` and `date` filled in, fields in FIELDS order."""
    unknown = set(record) - set(FIELDS)
    if unknown:
        raise ValueError(f"unknown field(s) {sorted(unknown)}; allowed: {', '.join(FIELDS)}")
    missing = [k for k in REQUIRED if k not in record]
    if missing:
        raise ValueError(f"missing field(s) {missing}")
    if record.get("benchmark", kind) != kind:
        raise ValueError(f"benchmark = {record['benchmark']!r} does not match kind {kind!r}")
    value = record["value"]
    if value is not None and not isinstance(value, (int, float, str, bool)):
        raise ValueError(f"value = {value!r}: expected a number, a string, a boolean or null")
    for key in ("low", "high", "budget_mb", "rounds"):
        if record.get(key) is not None and not isinstance(record[key], (int, float)):
            raise ValueError(f"{key} = {record[key]!r}: expected a number")
    out = {"benchmark": kind, "date": _dt.date.today().isoformat(), **record}
    out["run"] = str(out["run"])
    return {k: out[k] for k in FIELDS if k in out and out[k] is not None or k == "value"}


def append_result(kind: str, record: dict, results_dir: Path | str | None = None) -> dict:
    """Append one record to <kind>.jsonl (created if absent) and return it as stored."""
    return append_results(kind, [record], results_dir)[0]


def append_results(kind: str, records: list[dict], results_dir: Path | str | None = None) -> list[dict]:
    """Append several records in one write, so a run's records stay together in the file."""
    stored = [normalize(kind, r) for r in records]
    path = results_path(kind, results_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in stored)
    with open(path, "a", encoding="utf-8") as f:
        try:  # two benchmarks appending at once must not interleave their lines
            import fcntl

            fcntl.flock(f, fcntl.LOCK_EX)
        except ImportError:  # not POSIX: a single write of the whole text is the best available
            pass
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    return stored


def read_results(kind: str, results_dir: Path | str | None = None) -> list[dict]:
    """Every record of <kind>.jsonl in file order (oldest first); [] if the file does not exist."""
    path = results_path(kind, results_dir)
    if not path.exists():
        return []
    records = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if line.strip():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{n}: not JSON ({e})") from None
    return records
