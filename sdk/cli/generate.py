"""`edgeflash generate`: complete a prompt and print the text (and statistics with --json)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from edgeflash.base.errors import UserError
from edgeflash.cli.args import (
    add_model_options,
    add_sampling_options,
    load_kwargs,
    non_negative_int,
    sampling_kwargs,
)

HELP = "generate text from a prompt"
DESCRIPTION = """Generate a continuation of PROMPT and stream it to stdout.

examples:
  edgeflash generate -p "The sea at night" -n 64
  edgeflash generate -m smollm2-135m --chat -p "Name three rivers." --json
  edgeflash generate -m model.gguf --prompt-file story.txt -n 128 --temperature 0.8 --seed 1
"""


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("generate", help=HELP, description=DESCRIPTION,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_options(p)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("-p", "--prompt", help="the prompt text")
    src.add_argument("--prompt-file", type=Path, help="read the prompt from this file")
    p.add_argument("-n", "--max-tokens", type=non_negative_int, default=64,
                   help="maximum tokens to generate (default: %(default)s)")
    p.add_argument("--chat", action="store_true",
                   help="wrap the prompt as a user message in the model's chat format")
    add_sampling_options(p)
    p.add_argument("--json", action="store_true",
                   help="end the output with one JSON object of run statistics")
    p.set_defaults(run=run)


def read_prompt(args: argparse.Namespace) -> str:
    if args.prompt is not None:
        return args.prompt
    try:
        return args.prompt_file.read_text(encoding="utf-8")
    except OSError as e:
        raise UserError(f"{args.prompt_file}: cannot read the prompt file ({e.strerror})") from None


def run(args: argparse.Namespace) -> int:
    import edgeflash as ef

    prompt = read_prompt(args)
    t0 = time.perf_counter()
    model = ef.load(args.model, **load_kwargs(args))
    load_s = time.perf_counter() - t0
    plan = getattr(model.engine, "plan", None)
    if plan is not None and not args.json:
        sys.stderr.write(plan.describe() + "\n")
    prompt_ids = model.chat_prompt([{"role": "user", "content": prompt}]) if args.chat else model.encode(prompt)
    generation = model.generation(prompt_ids, args.max_tokens, **sampling_kwargs(args))
    out = sys.stdout
    if not args.chat and not args.json:
        out.write(prompt)
    for piece in generation:
        out.write(piece)
        out.flush()
    out.write("\n")
    out.flush()
    result = generation.result()
    stats = {"model": model.name, "load_s": round(load_s, 3), **result.stats}
    if args.json:
        out.write(json.dumps(stats) + "\n")
    else:
        decode = stats.get("decode_tok_s")
        sys.stderr.write(f"[{stats['engine']}] prompt {stats['prompt_tokens']} tok at "
                         f"{stats['prefill_tok_s']} tok/s, generated {stats['generated_tokens']} tok at "
                         f"{decode if decode is not None else '-'} tok/s, peak RSS "
                         f"{stats['peak_rss_bytes'] / 2**20:.0f} MiB\n")
    return 0
