"""Measured tokens/s of exact flash and of sparse FFN settings, per bundle and budget, remembered on
the device (like `edgeflash probe-io`'s profile) so that the planner's choice rests on measurements:
a sparse setting that measured slower than exact flash is not used, and `--ffn-sparsity auto`
picks the fastest measured setting.

File: ~/.cache/edgeflash/sparsity-profile.json (XDG_CACHE_HOME respected)
    {"<weights file>|<size>|<mtime_ns>": [{"budget": bytes, "config": "exact" | "s0.5 k4", "tok_s": 7.1}, ...]}
"""

from __future__ import annotations

import json
import os
from pathlib import Path

BUDGET_TOLERANCE = 0.05  # a measurement serves budgets within 5% of the one it ran at


def profile_path() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "edgeflash" / "sparsity-profile.json"


def config_name(sparsity: float | None, window: int = 0) -> str:
    return "exact" if sparsity is None else f"s{sparsity:g} k{window}"


def parse_config(name: str) -> tuple[float | None, int]:
    if name == "exact":
        return None, 0
    s, k = name.split()
    return float(s[1:]), int(k[1:])


def _key(weights: Path) -> str:
    st = os.stat(weights)
    return f"{Path(weights).resolve()}|{st.st_size}|{st.st_mtime_ns}"


def _read() -> dict:
    try:
        return json.loads(profile_path().read_text())
    except (OSError, ValueError):
        return {}


def measurements(weights: Path, budget: int) -> dict[str, float]:
    """{config: tokens/s} measured for this weights file at the budget nearest this one (within 5%)."""
    try:
        rows = _read().get(_key(weights), [])
    except OSError:
        return {}
    near = [r for r in rows if abs(r["budget"] - budget) <= BUDGET_TOLERANCE * budget]
    if not near:
        return {}
    nearest = min(near, key=lambda r: abs(r["budget"] - budget))["budget"]
    return {r["config"]: float(r["tok_s"]) for r in near if r["budget"] == nearest}


def lookup(weights: Path, budget: int, sparsity: float, window: int) -> dict[str, float] | None:
    """{"exact": tok/s, "sparse": tok/s} when both were measured at this budget, else None."""
    m = measurements(weights, budget)
    name = config_name(sparsity, window)
    if "exact" in m and name in m:
        return {"exact": m["exact"], "sparse": m[name]}
    return None


def record(weights: Path, budget: int, results: dict[str, float]) -> Path:
    """Remember {config: tok/s} for this weights file and budget (replacing that budget's earlier rows)."""
    data = _read()
    key = _key(weights)
    rows = [r for r in data.get(key, []) if r["budget"] != budget]
    rows += [{"budget": budget, "config": c, "tok_s": round(v, 3)} for c, v in results.items()]
    data[key] = rows
    out = profile_path()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1))
    tmp.replace(out)
    return out
