"""One rank's engine: the native engine over this rank's bundle (its heads, neurons and vocabulary
rows, under its own memory budget), its partial sums completed by the communicator, and its logits
gathered so that every rank holds the whole row and samples the same token (every rank runs the
same generation loop, in step).

    comm = Communicator()
    loaded = load_rank("out/", comm, memory_budget="1GiB")   # out/rank-<k> for rank k
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from edgeflash.base.errors import UserError
from edgeflash.base.rss import current_rss_bytes
from edgeflash.base.sizes import parse_size
from edgeflash.memory.planner import BudgetError
from edgeflash.runtime.distributed.comm import Communicator
from edgeflash.runtime.distributed.shard import Shard, plan_shards, shard_of
from edgeflash.runtime.loader import LoadedModel, load_model
from edgeflash.runtime.native_engine import NativeEngine

RANK_DIR = "rank-{rank}"  # the layout `edgeflash export --ranks N` writes


def rank_path(path: str | Path, rank: int) -> Path:
    """This rank's bundle: `path` itself when it is one, else path/rank-<rank>."""
    path = Path(path).expanduser()
    if (path / "manifest.json").exists():
        return path
    candidate = path / RANK_DIR.format(rank=rank)
    if not (candidate / "manifest.json").exists():
        raise UserError(f"{path}: no bundle for rank {rank} (expected {candidate}, written by "
                        "`edgeflash export SOURCE -o OUT --ranks N`)")
    return candidate


# What a leader tells its followers to run (the header of each engine call).
OP_FORWARD, OP_FORWARD_ALL, OP_TRUNCATE, OP_RESET, OP_STOP = range(5)


class DistributedEngine:
    """The Engine contract (forward, truncate, reset, stats) for one rank of a split model.

    Two ways to run the ranks: every rank runs the same generation loop (`lead=False`: each gets
    every logit and samples the same token), or rank 0 leads (`lead=True`: its generation loop,
    a server's for instance, drives the engine, every call is sent to the other ranks, which run
    `follow`, and only rank 0 receives the logits)."""

    name = "native-tp"

    def __init__(self, inner: NativeEngine, comm: Communicator, shard: Shard, rows: list[tuple[int, int]],
                 transport_rss: int, lead: bool = False):
        self.inner, self.comm, self.shard, self.rows = inner, comm, shard, rows
        self.transport_rss, self.lead = transport_rss, lead
        inner._engine.set_partial_sums(comm.complete_partial_sums)
        self._cpu0 = time.process_time()

    def __getattr__(self, name: str) -> Any:  # spec, tokenizer, tokens, context_length, plan ...
        if name == "forward_tree":  # speculative verification is not split over ranks
            raise AttributeError(name)
        return getattr(self.inner, name)

    def forward(self, tokens: Sequence[int], *, all_logits: bool = False) -> np.ndarray:
        if self.lead:
            self._tell(OP_FORWARD_ALL if all_logits else OP_FORWARD, tokens)
        return self._forward(tokens, all_logits)

    def _forward(self, tokens: Sequence[int], all_logits: bool) -> np.ndarray:
        logits = self.inner.forward(tokens, all_logits=all_logits)
        if len(logits):
            if self.lead or self.comm.rank != 0 and self._following:
                self.comm.gather_rows(logits, self.rows)
            else:
                self.comm.allgather_rows(logits, self.rows)
        return logits

    def truncate(self, n_tokens: int) -> None:
        if self.lead:
            self._tell(OP_TRUNCATE, [n_tokens])
        self.inner.truncate(n_tokens)

    def reset(self) -> None:
        if self.lead:
            self._tell(OP_RESET, [])
        self.inner.reset()

    def close(self) -> None:
        """A leader releases its followers (their `follow` returns)."""
        if self.lead:
            self._tell(OP_STOP, [])
            self.lead = False
        self.inner.close()

    _following = False

    def _tell(self, op: int, values: Sequence[int]) -> None:
        self.comm.bcast_ints(np.array([op, len(values)]), 2)
        if len(values):
            self.comm.bcast_ints(np.asarray(values), len(values))

    def follow(self) -> None:
        """Run what rank 0 (a leader) asks until it stops: ranks > 0 of a served model."""
        self._following = True
        while True:
            op, n = (int(v) for v in self.comm.bcast_ints(None, 2, idle=True))
            values = self.comm.bcast_ints(None, n) if n else np.empty(0, np.int64)
            if op == OP_STOP:
                return
            if op in (OP_FORWARD, OP_FORWARD_ALL):
                self._forward(values.astype(np.int32), op == OP_FORWARD_ALL)
            elif op == OP_TRUNCATE:
                self.inner.truncate(int(values[0]))
            elif op == OP_RESET:
                self.inner.reset()

    def stats(self) -> dict[str, Any]:
        out = self.inner.stats()
        s = self.comm.stats
        out.update({"engine": self.name, "rank": self.comm.rank, "ranks": self.comm.size, "comm_wait": self.comm.wait,
                    "allreduces": s.allreduces, "allreduce_s": round(s.allreduce_s, 6), "logit_gathers": s.gathers,
                    "logit_gather_s": round(s.gather_s, 6), "transport_rss_bytes": self.transport_rss,
                    "cpu_s": round(time.process_time() - self._cpu0, 6), "d_model": self.inner.spec.d_model,
                    "vocab_size": self.inner.spec.vocab_size})
        if out.get("memory_budget_bytes"):  # the rank's whole budget: the transport came out of it
            out["memory_budget_bytes"] += self.transport_rss
        return out


def load_rank(path: str | Path, comm: Communicator, *, memory_budget: str | int | None = None,
              transport_rss: int = 0, speculative: str = "none", lead: bool = False, **options: Any) -> LoadedModel:
    """This rank's part of a split model. `memory_budget` is this rank's whole budget: what the
    transport added to the process (`transport_rss`, measured by the caller) comes out of it."""
    if speculative != "none":
        raise UserError("speculative decoding does not run on several ranks yet; leave --speculative off")
    bundle = rank_path(path, comm.rank)
    budget = None
    if memory_budget is not None:
        budget = parse_size(memory_budget) - transport_rss
        if budget <= 0:
            raise UserError(f"memory budget {memory_budget}: the transport alone takes {transport_rss / 2**20:.1f} MiB")
    try:
        loaded = load_model(bundle, memory_budget=budget, engine="native", **options)
    except BudgetError as e:  # the planner saw the budget less the transport: say so
        raise BudgetError(f"rank {comm.rank}: {e} (of --memory-budget {memory_budget}, MPI took "
                          f"{transport_rss / 2**20:.1f} MiB; the planner had the rest)",
                          e.minimum_bytes + transport_rss if e.minimum_bytes else None) from None
    shard = shard_of(loaded.source)
    if shard is None:
        raise UserError(f"{bundle}: not a per-rank bundle (write them with `edgeflash export SOURCE -o OUT --ranks N`)")
    if shard.ranks != comm.size or shard.rank != comm.rank:
        raise UserError(f"{bundle}: holds rank {shard.rank} of {shard.ranks}, but this is rank {comm.rank} of "
                        f"{comm.size}; launch it with mpirun -n {shard.ranks}")
    full_spec = loaded.source.spec  # the whole vocabulary (a rank's spec has its heads and neurons only)
    rows = [s.vocab for s in plan_shards(_whole_spec(loaded), shard.ranks)]
    if rows[comm.rank] != shard.vocab or full_spec.vocab_size != rows[-1][1]:
        raise UserError(f"{bundle}: its vocabulary rows {shard.vocab} do not match a split over {shard.ranks} ranks")
    loaded.engine = DistributedEngine(loaded.engine, comm, shard, rows, transport_rss, lead=lead and comm.rank == 0)
    return loaded


def _whole_spec(loaded: LoadedModel):
    from edgeflash.runtime.spec import ModelSpec

    return ModelSpec.from_dict(loaded.source.info["bundle"].manifest.raw["shard"]["spec"])


def start_transport(wait: str = "auto", threads: int = 1) -> tuple[Communicator, int]:
    """The communicator, and the resident memory starting it added to this process."""
    before = current_rss_bytes()
    comm = Communicator(wait=wait, threads=threads)
    return comm, max(0, current_rss_bytes() - before)
