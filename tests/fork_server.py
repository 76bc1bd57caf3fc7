"""One process that has imported what a command needs (torch, the exporter, the command line)
serving runs of it as forked children: a fresh interpreter per run would spend most of a short run
importing. kill_driver.py --serve and fuzz/fork_runner.py are such servers.

Each line on stdin is one run, {"stdout": PATH, "stderr": PATH, "timeout": S, ...} plus what the
server's `run` reads; the answer line is {"pid": the child's pid, "status": its exit status, minus
the signal that ended it, or null when it ran past the timeout and its session was killed}. The
child is a process like any other, in a session of its own, with stdin from /dev/null and its output
in the two files: SIGKILL ends it where it stands, and what it leaves on disk is what a process of
the command would leave."""

from __future__ import annotations

import atexit
import json
import os
import signal
import sys
import time
from collections.abc import Callable
from typing import NoReturn


def serve(run: Callable[[dict], int | None]) -> int:
    """Answer every request on stdin with a forked child that calls run(request)."""
    for line in sys.stdin:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            _child(run, request)
        print(json.dumps({"pid": pid, "status": _wait(pid, request["timeout"])}), flush=True)
    return 0


def _child(run: Callable[[dict], int | None], request: dict) -> NoReturn:
    """run(request) as the interpreter would run a script: SystemExit's code is the status, an
    uncaught exception is printed and gives 1, exit handlers run."""
    status = 1
    try:
        os.setsid()
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
            target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(target, fd)
            os.close(target)
        try:
            code = run(request)
            status = code if isinstance(code, int) else 0 if code is None else 1
        except SystemExit as e:
            if e.code is None or isinstance(e.code, int):
                status = e.code or 0
            else:
                sys.stderr.write(f"{e.code}\n")
        except BaseException:
            sys.excepthook(*sys.exc_info())
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(status)


def _wait(pid: int, timeout: float) -> int | None:
    """The child's exit status, or None after killing its session at the timeout."""
    deadline = time.monotonic() + timeout
    while True:
        done, wait_status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(wait_status)
        if time.monotonic() > deadline:
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            os.waitpid(pid, 0)
            return None
        time.sleep(0.002)
