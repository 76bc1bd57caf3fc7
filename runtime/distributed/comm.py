"""The ranks' communicator: MPI through mpi4py (Open MPI from Debian). Measured against
torch.distributed with gloo on the machine the docs name (docs/scale-out.md): a tenth of the
memory a rank adds (10 MiB against 191 MiB) and a faster start, and no torch on a board.

Two ways to wait for an all-reduce: `spin` is MPI's own blocking call (fastest when every rank has
its cores to itself, as on separate boards); `poll` starts a non-blocking all-reduce and sleeps
between tests, for ranks that share cores (several on one machine), where a spinning rank takes
the core another rank needs to finish its part. `auto` polls when the ranks on this host need more
threads than it has cores.
"""

from __future__ import annotations

import ctypes
import os
import socket
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from edgeflash.base.errors import UserError

WAITS = ("auto", "spin", "poll")
POLL_SLEEP_S = 20e-6
POLL_MAX_SLEEP_S = 320e-6
IDLE_SLEEP_S = 1e-3  # a follower between requests
PR_SET_TIMERSLACK = 29
LAUNCHER_ENV = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK")  # set by mpirun / mpiexec


def launched_by_mpi() -> bool:
    return any(k in os.environ for k in LAUNCHER_ENV)


@dataclass
class CommStats:
    allreduces: int = 0
    allreduce_s: float = 0.0
    gathers: int = 0
    gather_s: float = 0.0
    bytes_reduced: int = 0
    by_point: dict[int, int] = field(default_factory=dict)

    @property
    def seconds(self) -> float:
        return self.allreduce_s + self.gather_s


class Communicator:
    """One process's view of the group (MPI.COMM_WORLD)."""

    def __init__(self, wait: str = "auto", threads: int = 1):
        if wait not in WAITS:
            raise UserError(f"wait = {wait!r}: expected one of {', '.join(WAITS)}")
        try:
            from mpi4py import MPI
        except ImportError:
            raise UserError("running on several ranks needs mpi4py (pip install mpi4py) and an MPI library "
                            "(Debian: apt-get install openmpi-bin)") from None
        self.MPI = MPI
        self.comm = MPI.COMM_WORLD
        self.rank, self.size = self.comm.rank, self.comm.size
        self.stats = CommStats()
        hosts = self.comm.allgather(socket.gethostname())
        self.ranks_on_host = hosts.count(socket.gethostname())
        if wait == "auto":
            wait = "poll" if self.ranks_on_host * threads > (os.cpu_count() or 1) else "spin"
        self.wait = wait
        if wait == "poll":  # sleeps of tens of microseconds, not the default 50 us of slack
            ctypes.CDLL(None).prctl(PR_SET_TIMERSLACK, 1000, 0, 0, 0)

    # -- the engine's partial sums ---------------------------------------------------------------

    def complete_partial_sums(self, point: int, layer: int, x: np.ndarray) -> None:
        """Sum x over the ranks in place (the engine's PartialSums hook)."""
        start = time.perf_counter()
        self.allreduce(x)
        s = self.stats
        s.allreduce_s += time.perf_counter() - start
        s.allreduces += 1
        s.bytes_reduced += x.nbytes
        s.by_point[point] = s.by_point.get(point, 0) + 1

    def allreduce(self, x: np.ndarray) -> None:
        MPI = self.MPI
        if self.wait == "spin":
            self.comm.Allreduce(MPI.IN_PLACE, x, op=MPI.SUM)
            return
        request = self.comm.Iallreduce(MPI.IN_PLACE, x, op=MPI.SUM)
        self._wait(request)

    # -- logits and control ------------------------------------------------------------------------

    def allgather_rows(self, logits: np.ndarray, rows: list[tuple[int, int]]) -> None:
        """Each rank computed logits[:, v0:v1] of its own vocabulary rows; afterwards every rank has
        all of them (so that each samples the same token from the same numbers)."""
        start = time.perf_counter()
        MPI = self.MPI
        counts = [v1 - v0 for v0, v1 in rows]
        displs = [v0 for v0, _ in rows]
        for r in range(logits.shape[0]):
            row = logits[r]
            self._wait(self.comm.Iallgatherv(MPI.IN_PLACE, [row, counts, displs, MPI.FLOAT]))
        self.stats.gathers += 1
        self.stats.gather_s += time.perf_counter() - start

    def gather_rows(self, logits: np.ndarray, rows: list[tuple[int, int]], root: int = 0) -> None:
        """Like allgather_rows, but only `root` receives the whole rows (a leader samples for all)."""
        start = time.perf_counter()
        MPI = self.MPI
        counts = [v1 - v0 for v0, v1 in rows]
        displs = [v0 for v0, _ in rows]
        v0, v1 = rows[self.rank]
        for r in range(logits.shape[0]):
            row = logits[r]
            if self.rank == root:
                self._wait(self.comm.Igatherv(MPI.IN_PLACE, [row, counts, displs, MPI.FLOAT], root=root))
            else:
                self._wait(self.comm.Igatherv(row[v0:v1], None, root=root))
        self.stats.gathers += 1
        self.stats.gather_s += time.perf_counter() - start

    def bcast_ints(self, values: np.ndarray | None, count: int, root: int = 0, idle: bool = False) -> np.ndarray:
        """`count` int64 values from `root` (every rank gives the count). `idle`: the wait may be long
        (a follower waiting for the next request), so its polls back off to a millisecond."""
        buf = np.zeros(count, np.int64) if values is None else np.ascontiguousarray(values, np.int64)
        self._wait(self.comm.Ibcast(buf, root=root), idle=idle)
        return buf

    def _wait(self, request: Any, idle: bool = False) -> None:
        if self.wait == "spin" and not idle:
            request.Wait()
            return
        # Sleeps grow while the wait lasts: a peer that needs the shared core to finish its part gets
        # it without being interrupted every few microseconds, and a short wait still ends soon.
        sleep, longest = POLL_SLEEP_S, IDLE_SLEEP_S if idle else POLL_MAX_SLEEP_S
        while not request.Test():
            time.sleep(sleep)
            sleep = min(longest, sleep * 2)

    def bcast(self, obj: Any, root: int = 0) -> Any:
        return self.comm.bcast(obj, root=root)

    def gather(self, obj: Any, root: int = 0) -> list[Any] | None:
        return self.comm.gather(obj, root=root)

    def allgather(self, obj: Any) -> list[Any]:
        return self.comm.allgather(obj)
