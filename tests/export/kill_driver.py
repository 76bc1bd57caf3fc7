"""`edgeflash export` that SIGKILLs itself just before its K-th file-system step.

    python kill_driver.py K [--no-exchange] -- export SOURCE -o OUT ...

The steps are every call the bundle writer makes to change or sync the file system (open, write,
pwrite, fsync, fdatasync, rename, unlink, close, rmtree, the directory exchange): killing before
each of them in turn is a kill at every point of an export where the disk's state can differ.
Removing what earlier killed exports left (clean_stale) is not counted, so step K is the same
step whatever is left over. K = 0 kills nothing and prints `steps a,b,c...` (the name of each step, in order). `--no-exchange` makes the writer
behave as on a file system without RENAME_EXCHANGE.

    python kill_driver.py --serve

runs the same exports as forked children of one process that has imported the exporter (torch
among it) once (tests/fork_server.py): each line on stdin, {"argv": [K, ..., "--", "export", ...],
"stdout": PATH, "stderr": PATH, "timeout": S}, is one export in a child of its own.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
from pathlib import Path
from typing import Any

COUNTED = {"open", "write", "pwrite", "fsync", "fdatasync", "rename", "replace", "unlink", "close", "rmtree",
           "posix_fadvise", "truncate", "mkdir", "rmdir"}


class _Steps:
    def __init__(self, kill_at: int):
        self.kill_at, self.count, self.names, self.paused = kill_at, 0, [], False

    def step(self, name: str) -> None:
        if self.paused:
            return
        self.count += 1
        self.names.append(name)
        if self.count == self.kill_at:
            os.kill(os.getpid(), signal.SIGKILL)


class _Counting:
    """A module seen through a proxy that counts calls of COUNTED functions."""

    def __init__(self, module: Any, steps: _Steps):
        self._module, self._steps = module, steps

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._module, name)
        if name not in COUNTED or not callable(value):
            return value

        def counted(*args: Any, **kw: Any) -> Any:
            self._steps.step(name)
            return value(*args, **kw)

        return counted


def main(args: list[str] | None = None) -> int:
    args = sys.argv[1:] if args is None else args
    split = args.index("--")
    options, argv = args[:split], args[split + 1:]
    steps = _Steps(int(options[0]))
    from edgeflash.export import writer

    writer.os = _Counting(os, steps)
    writer.shutil = _Counting(shutil, steps)
    exchange = writer._rename_exchange

    def counted_exchange(a, b):
        steps.step("exchange")
        return False if "--no-exchange" in options else exchange(a, b)

    writer._rename_exchange = counted_exchange
    clean = writer.clean_stale

    def uncounted_clean(*args, **kw):  # what earlier kills left varies; the steps after it do not
        steps.paused = True
        try:
            return clean(*args, **kw)
        finally:
            steps.paused = False

    writer.clean_stale = uncounted_clean
    from edgeflash.cli.main import main as cli

    status = cli(argv)
    print(f"steps {','.join(steps.names)}", flush=True)
    return status


def serve() -> int:
    import edgeflash.cli.main  # noqa: F401  (imported once, before the forks)
    import edgeflash.export.pipeline  # noqa: F401
    import edgeflash.export.writer  # noqa: F401

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/
    from fork_server import serve as serve_forked

    return serve_forked(lambda request: main(request["argv"]))


if __name__ == "__main__":
    sys.exit(serve() if sys.argv[1:] == ["--serve"] else main())
