"""`edgeflash inspect`: a bundle's manifest, block plan and quality report."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

HELP = "show a bundle's manifest, block plan and quality report (or a GGUF file's model)"
DESCRIPTION = """Show what a bundle holds: model spec, quantization rules, every block (offset, size,
formats, neuron arenas), calibration data and the quality report written at export.
Checksums are verified unless --no-verify. Given a GGUF file instead, show its model, tokenizer
and tensor formats after checking every field and tensor as a load would.

examples:
  edgeflash inspect out/gemma-q4_0
  edgeflash inspect out/gemma-q4_0 --tensors
  edgeflash inspect out/gemma-q4_0 --json
  edgeflash inspect model.gguf
"""


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("inspect", help=HELP, description=DESCRIPTION,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("bundle", metavar="BUNDLE", help="bundle directory, GGUF file or model alias")
    p.add_argument("--tensors", action="store_true", help="also list every tensor with its format and SQNR")
    p.add_argument("--no-verify", action="store_false", dest="verify", help="skip the block checksums")
    p.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from edgeflash.base.models import resolve_model

    args.bundle = resolve_model(args.bundle)
    if not args.bundle.is_dir():
        return _run_gguf(args)
    from edgeflash.base.printable import printable
    from edgeflash.runtime.bundle import Bundle
    from edgeflash.runtime.bundle.describe import render, summary

    bundle = Bundle.open(args.bundle, verify=args.verify)
    manifest = bundle.manifest.raw
    if args.json:
        data = summary(manifest)
        data["verified"] = args.verify
        if args.tensors:
            data["tensors"] = manifest.get("tensors", [])
        sys.stdout.write(json.dumps(data) + "\n")
    else:
        text = render(manifest, blocks=True, tensors=args.tensors)
        # names and notes come from the file: escaped, so no byte of it reaches the terminal raw
        sys.stdout.write("\n".join(printable(line, 1 << 20) for line in text.splitlines()) + "\n")
        sys.stdout.write(f"checksums: {'verified' if args.verify else 'not checked'}\n")
    return 0


def _run_gguf(args: argparse.Namespace) -> int:
    from edgeflash.runtime.sources.describe import gguf_summary, render_gguf

    data = gguf_summary(args.bundle)
    sys.stdout.write((json.dumps(data) if args.json else render_gguf(data)) + "\n")
    return 0
