"""What speculation learned on this machine, kept between runs.

A controller learns what a plain step, a verification pass of each width, a draft-model forward
and a draft model's catch-up cost, and how often the target accepts a draft model's tokens by
their probability (controller.py). A process keeps that across its generations; this file keeps it
across processes, so a command-line run, which is one generation, starts where the last run on the
same model and settings ended instead of from priors (until it has measured them, a first answer
guesses pass costs and lets a draft model join only 8 steps in).

What is kept: costs, a draft model's calibration, how often a lookup chain's first token was
accepted (where each answer's lookup rates start) and how sure of its tokens the target usually is
(what a draft model joining an answer compares that answer's confidence with). Not kept: the lookup
rates and a draft model's recent rate of the last answer, which follow its text (a new answer
starts them from what the counts say), and the guards, whose pauses belong to the run that lost.

One JSON file per target file (its size and modification time), drafters, memory plan, engine
settings and verification kind (greedy or sampled), in `$EDGEFLASH_CACHE/speculative` (or
`$EDGEFLASH_SPECULATIVE_STATE`). A file that does not read back as expected is ignored and
replaced; a cache that cannot be written is not an error (the run just learns again). A restored
pass cost is never above the controller's prior for its width: a pass measured slow once (a busy
moment) would otherwise keep every later run from verifying, and so from measuring it again.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from pathlib import Path
from typing import Any

import numpy as np
from edgeflash.base.packaged_models import cache_dir
from edgeflash.runtime.speculative.controller import Acceptance, CostModel, prior_pass_cost

VERSION = 1


def learned_dir() -> Path:
    """$EDGEFLASH_SPECULATIVE_STATE, else `speculative` beside the model cache."""
    chosen = os.environ.get("EDGEFLASH_SPECULATIVE_STATE")
    return Path(chosen).expanduser() if chosen else cache_dir().parent / "speculative"


def _file_identity(path: str | Path) -> list[Any]:
    resolved = Path(path).resolve()
    st = resolved.stat()
    return [str(resolved), st.st_size, st.st_mtime_ns]


def learned_path(engine: Any, kind: str, draft_engine: Any | None, greedy: bool) -> Path | None:
    """Where the state of `kind` drafting for `engine` is kept (None: the target is not a file)."""
    try:
        target = _file_identity(engine.source.path)
        draft = _file_identity(draft_engine.source.path) if draft_engine is not None else None
    except (OSError, AttributeError, TypeError):
        return None
    plan = getattr(getattr(engine, "weights", None), "plan", None)
    key = {
        "version": VERSION, "target": target, "kind": kind.split(":", 1)[0], "draft": draft,
        "plan": None if plan is None else [plan.strategy, plan.budget, plan.total],
        "activations": engine.activations, "kv": engine.kv_format, "threads": engine.threads,
        "greedy": greedy,
    }
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:24]
    return learned_dir() / f"{digest}.json"


def _seconds(value: Any) -> float:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{value!r} is not a positive number of seconds")
    return float(value)


def _by_name(value: Any) -> dict[str, float]:
    if not isinstance(value, dict):
        raise ValueError("expected an object")
    return {str(k): _seconds(v) for k, v in value.items()}


def restore(path: Path | None, costs: CostModel, acceptance: Acceptance) -> bool:
    """Fill `costs` and `acceptance` from `path`; False (both untouched) if it does not hold a
    state this version wrote."""
    if path is None:
        return False
    try:
        data = json.loads(path.read_text())
        if data.get("version") != VERSION:
            return False
        c = data["costs"]
        plain = None if c["plain"] is None else _seconds(c["plain"])
        verify = {int(w): _seconds(s) for w, s in c["verify"].items()}
        draft, catch_up = _by_name(c["draft"]), _by_name(c["catch_up"])
        tables = {}
        for origin, rows in data["acceptance"].items():
            table = np.asarray(rows, dtype=np.float64)
            if table.shape != (Acceptance.BINS, 2) or not _counts(table):
                return False
            tables[str(origin)] = table
        lookup_first = acceptance.lookup_first
        if "lookup_first" in data:  # absent from files written before it was kept
            lookup_first = np.asarray(data["lookup_first"], dtype=np.float64)
            if lookup_first.shape != acceptance.lookup_first.shape or not _counts(lookup_first):
                return False
        usual = data.get("usual_confidence")  # absent from files written before it was kept
        if usual is not None and (isinstance(usual, bool) or not isinstance(usual, (int, float))
                                  or not 0 < usual <= 1):
            return False
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False
    if any(w < 2 for w in verify):
        return False
    if plain is not None:
        verify = {w: min(s, prior_pass_cost(plain, w)) for w, s in verify.items()}
    per_plain = 1.0 / (plain or 1.0)  # draft costs are kept in plain steps (CostModel)
    costs.plain, costs.verify = plain, verify
    costs.draft_share = {k: s * per_plain for k, s in draft.items()}
    costs.catch_up_share = {k: s * per_plain for k, s in catch_up.items()}
    # a draft model's recent rate starts from its long-run one (files that kept it: not read)
    acceptance.model, acceptance.model_recent, acceptance.lookup_first = tables, {}, lookup_first
    acceptance.usual_confidence = None if usual is None else float(usual)
    acceptance.new_text()
    return True


def _counts(table: np.ndarray) -> bool:
    """Whether rows of (accepted, tested) counts are finite, with 0 <= accepted <= tested, tested > 0."""
    return bool(np.all(np.isfinite(table)) and np.all(table >= 0) and np.all(table[:, 0] <= table[:, 1])
                and np.all(table[:, 1] > 0))


def store(path: Path | None, costs: CostModel, acceptance: Acceptance) -> None:
    """Write the state to `path` (whole or not at all); an unwritable cache is silently skipped."""
    if path is None:
        return
    data = {
        "version": VERSION,
        "costs": {"plain": costs.plain, "verify": {str(w): s for w, s in costs.verify.items()},
                  "draft": {k: costs.draft(k) for k in costs.draft_share},
                  "catch_up": {k: costs.catch_up(k) for k in costs.catch_up_share}},
        "acceptance": {origin: table.tolist() for origin, table in acceptance.model.items()},
        "lookup_first": acceptance.lookup_first.tolist(),
        "usual_confidence": acceptance.usual_after_this_answer(),
    }
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps(data))
        os.replace(tmp, path)
    except OSError:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass
