"""The board harness: namespaces on a switch that delays and shapes each link, MPI across them,
and nothing left behind."""

from __future__ import annotations

import os
import subprocess
import sys

import boards
import pytest
from mpi_helpers import HERE, MPI_ENV, worker_result

PREFIX = "eftest"  # not the prefix a benchmark uses, so both can run


@pytest.fixture
def cleanup():
    yield
    boards.down(PREFIX)
    assert boards.existing(PREFIX) == []


def test_up_is_idempotent_and_down_removes_everything(cleanup):
    assert boards.up(2, "none", PREFIX) == ["10.77.0.1", "10.77.0.2"]
    assert boards.up(3, "none", PREFIX) == ["10.77.0.1", "10.77.0.2", "10.77.0.3"]  # replaces the first
    assert sorted(boards.existing(PREFIX)) == [f"{PREFIX}0", f"{PREFIX}1", f"{PREFIX}2"]
    boards.down(PREFIX)
    boards.down(PREFIX)  # nothing left: a no-op
    assert boards.existing(PREFIX) == []
    root_routes = subprocess.run(["ip", "route"], check=False, capture_output=True, text=True).stdout
    assert "10.77.0." not in root_routes  # the boards' network is not reachable from outside


def test_link_latency_is_added(cleanup):
    boards.up(2, "none", PREFIX)
    plain = boards.ping_ms(0, 1, count=20, prefix=PREFIX)
    boards.up(2, "wifi", PREFIX)
    wifi = boards.ping_ms(0, 1, count=20, prefix=PREFIX)
    assert wifi >= 3.0 > plain, (wifi, plain)  # 1.5 ms each way


def test_mpi_ranks_in_separate_namespaces(cleanup, tiny_models, tmp_path):
    """Rank k runs in namespace k and the ranks reach each other only through the switch."""
    from edgeflash.export.shard import export_shards

    export_shards(tiny_models["llama-gqa-untied"], tmp_path / "split", 2, progress=False)
    boards.up(2, "ethernet", PREFIX)
    cmd = boards.mpirun_command(2, [sys.executable, str(HERE / "tp_worker.py"), str(tmp_path / "split"), "-n", "4"],
                                prefix=PREFIX)
    done = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=300, env={**os.environ, **MPI_ENV})
    ranks = worker_result(done)
    assert ranks[0]["tokens"] == ranks[1]["tokens"] and len(ranks[0]["tokens"]) == 4
    assert ranks[0]["allreduce_s"] > 0
