"""`edgeflash probe-io`: measure the storage's direct-read throughput for the memory planner."""

from __future__ import annotations

import argparse
from pathlib import Path

from edgeflash.base.errors import UserError
from edgeflash.cli.args import positive_int

HELP = "measure storage read throughput by chunk size and reads in flight"
DESCRIPTION = """Read a file with direct I/O (no page cache) for every chunk size and queue depth,
print the throughput table, and remember the best setting for that device: budgeted runs
(--memory-budget) then stream with it.

examples:
  edgeflash probe-io                          # the default model's file
  edgeflash probe-io --file bundle/weights.bin --megabytes 256
"""


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("probe-io", help=HELP, description=DESCRIPTION,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--file", type=Path, default=None,
                   help="file to read (default: the default model's weights); it is only read")
    p.add_argument("-m", "--model", default="default", help="model whose weights file to read if --file is absent")
    p.add_argument("--megabytes", type=positive_int, default=128, help="bytes read per measurement (default: %(default)s)")
    p.add_argument("--no-save", action="store_true", help="print only; do not update the profile")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from edgeflash.base.models import resolve_model
    from edgeflash.memory.io_profile import probe, save

    path = args.file or resolve_model(args.model)
    if path.is_dir():
        path = path / "weights.bin"
    if not path.is_file():
        raise UserError(f"{path}: no such file to read")
    rows, direct = probe(path, args.megabytes << 20)
    print(f"{path} ({'direct I/O' if direct else 'page cache: this file system has no direct I/O'})")
    depths = sorted({r.threads for r in rows})
    print("chunk      " + "".join(f"{f'{d} in flight':>13}" for d in depths) + "   (MB/s)")
    for chunk in sorted({r.chunk_bytes for r in rows}):
        cells = [next(r.mb_per_s for r in rows if r.chunk_bytes == chunk and r.threads == d) for d in depths]
        print(f"{chunk >> 10:>6} KiB" + "".join(f"{c:13.0f}" for c in cells))
    best = max(rows, key=lambda r: r.mb_per_s)
    print(f"best: {best.chunk_bytes >> 10} KiB chunks, {best.threads} in flight, {best.mb_per_s:.0f} MB/s")
    if not args.no_save:
        print(f"saved to {save(path, rows)}")
    return 0
