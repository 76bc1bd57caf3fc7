"""`edgeflash models`: the model aliases, what each one is, whether it is on this machine, its size."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

HELP = "list the model aliases, what is installed and how large"
DESCRIPTION = """List the names -m accepts instead of a path: what model each is, the package it
comes from, and whether its file is on this machine (installed, or assembled from its package's
parts on first use) with its size. Nothing is installed or assembled by listing.

examples:
  edgeflash models
  edgeflash models --json
"""


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("models", help=HELP, description=DESCRIPTION,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", action="store_true", help="print one JSON object per alias, one per line")
    p.set_defaults(run=run)


def alias_rows() -> list[dict[str, Any]]:
    """One row per alias, from the alias table's own description of it (`describe_alias`) when it
    has one; an alias it does not describe is listed by name only."""
    from edgeflash.base import models

    describe = getattr(models, "describe_alias", None)
    rows = []
    for name in models.ALIASES:
        info = dict(describe(name)) if describe is not None else {}
        path = info.get("path")
        rows.append({"alias": name, "model": info.get("model"), "package": info.get("package"),
                     "chat": info.get("chat"), "path": str(path) if path else None,
                     "bytes": path.stat().st_size if path is not None and path.exists() else None})
    return rows


def run(args: argparse.Namespace) -> int:
    rows = alias_rows()
    if args.json:
        for row in rows:
            sys.stdout.write(json.dumps(row) + "\n")
        return 0
    width = max(len(r["alias"]) for r in rows)
    for r in rows:
        size = f"{r['bytes'] / 2**20:8.0f} MiB" if r["bytes"] is not None else "           -"
        where = r["path"] if r["path"] else ("not on this machine" if r["package"] else "")
        what = r["model"] or ""
        chat = {True: "chat", False: "base", None: ""}[r["chat"]]
        sys.stdout.write(f"{r['alias']:<{width}}  {what:<44} {chat:<4} {size}  {where}\n".rstrip() + "\n")
        if r["package"] and not r["path"]:
            sys.stdout.write(f"{'':<{width}}  (pip install {r['package']})\n")
    return 0
