"""Running ranks from the tests: mpirun on this machine (ranks talk TCP over loopback)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
MPI_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1", "OMPI_MCA_btl": "tcp,self",
           "OMPI_MCA_rmaps_base_oversubscribe": "1"}


def mpirun(n: int, args: list[str], timeout: int = 300) -> subprocess.CompletedProcess:
    """`mpirun -n n python args...`."""
    return subprocess.run(["mpirun", "-n", str(n), sys.executable, *args], check=False, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **MPI_ENV})


def worker_result(done: subprocess.CompletedProcess) -> list[dict]:
    for line in done.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise AssertionError(f"no result (exit {done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}")
