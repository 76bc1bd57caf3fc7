"""Runs of the `edgeflash` command as forked children of one process that has imported the
command line (and what `generate` and `inspect` import) once: a fresh interpreter per run would
spend about half of a small model's run importing.

    python fork_runner.py

serves requests as tests/fork_server.py describes, {"argv": [...], "stdout": PATH, "stderr": PATH,
"timeout": S, "address_space": BYTES}: each run is what the `edgeflash` script runs, with its
address space capped.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, when run as a script
import fork_server  # noqa: E402


def _run(request: dict) -> int | None:
    """What the `edgeflash` script runs, with the request's address-space cap."""
    resource.setrlimit(resource.RLIMIT_AS, (request["address_space"], request["address_space"]))
    from edgeflash.cli.main import main

    sys.argv = ["edgeflash", *request["argv"]]
    return main()


def serve() -> int:
    import edgeflash.cli.main  # noqa: F401  (imported once, before the forks)
    import edgeflash.runtime.native_engine  # noqa: F401
    import edgeflash.runtime.sources  # noqa: F401

    return fork_server.serve(_run)


class ForkRunner:
    """A fork_runner.py process and its request pipe (one caller at a time)."""

    def __init__(self, scratch: Path):
        self.scratch = scratch
        self.proc = subprocess.Popen([sys.executable, str(Path(__file__))], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})

    def run(self, argv: list[str], timeout: float, address_space: int) -> tuple[int | None, bytes, bytes, float]:
        """(exit status or None on timeout, stdout, stderr, seconds), as Harness._execute gives."""
        start = time.monotonic()
        out, err = self.scratch / f"stdout-{id(self)}", self.scratch / f"stderr-{id(self)}"
        request = {"argv": argv, "stdout": str(out), "stderr": str(err), "timeout": timeout,
                   "address_space": address_space}
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"fork_runner.py ended (status {self.proc.poll()})")
        status = json.loads(line)["status"]
        return status, out.read_bytes(), err.read_bytes(), time.monotonic() - start

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


if __name__ == "__main__":
    sys.exit(serve())
