"""Runs of the `edgeflash` command as forked children of one process that has imported the
command line (and what `generate` and `inspect` import) once: a fresh interpreter per run would
spend about half of a small model's run importing.

    python fork_runner.py

reads one request a line on stdin, {"argv": [...], "stdout": PATH, "stderr": PATH, "timeout": S,
"address_space": BYTES}, and answers each with {"pid": ..., "status": ...}: the exit status, minus
the signal that ended the run, or null when the run passed its timeout (then its session was
killed). Each run is a child of its own, in a session of its own, with its address space capped,
stdin from /dev/null and its output in the two files, and runs what the `edgeflash` script runs:
`sys.exit(main())`, an uncaught exception printed as the interpreter prints it, with status 1.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path


def _child(request: dict) -> None:
    status = 1
    try:
        os.setsid()
        resource.setrlimit(resource.RLIMIT_AS, (request["address_space"], request["address_space"]))
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
            target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(target, fd)
            os.close(target)
        from edgeflash.cli.main import main

        sys.argv = ["edgeflash", *request["argv"]]
        try:
            code = main()
            status = 0 if code is None else code if isinstance(code, int) else 1
        except SystemExit as e:
            if e.code is None or isinstance(e.code, int):
                status = e.code or 0
            else:
                sys.stderr.write(f"{e.code}\n")
        except BaseException:
            sys.excepthook(*sys.exc_info())
        import atexit

        atexit._run_exitfuncs()  # what the interpreter runs at its exit
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(status)


def serve() -> int:
    import edgeflash.cli.main  # noqa: F401  (imported once, before the forks)
    import edgeflash.runtime.native_engine  # noqa: F401
    import edgeflash.runtime.sources  # noqa: F401

    for line in sys.stdin:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            _child(request)
        deadline, status = time.monotonic() + request["timeout"], None
        while status is None:
            done, wait_status = os.waitpid(pid, os.WNOHANG)
            if done:
                status = os.waitstatus_to_exitcode(wait_status)
            elif time.monotonic() > deadline:
                try:
                    os.killpg(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                os.waitpid(pid, 0)
                break
            else:
                time.sleep(0.002)
        print(json.dumps({"pid": pid, "status": status}), flush=True)
    return 0


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
