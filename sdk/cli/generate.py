"""`edgeflash generate`: complete a prompt and print the text (or one JSON object with --json)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from edgeflash.base.errors import UserError
from edgeflash.cli.args import (
    add_advanced_engine_options,
    add_advanced_sampling_options,
    add_everyday_engine_options,
    add_everyday_sampling_options,
    add_model_option,
    load_kwargs,
    non_negative_int,
    sampling_kwargs,
    warn_without_chat_template,
)
from edgeflash.cli.ranks import add_rank_options, generate_on_ranks

HELP = "generate text from a prompt"
DESCRIPTION = """Generate a continuation of PROMPT and stream it to stdout.

Sampling follows llama.cpp's defaults (temperature 0.8, top-k 40, top-p 0.95, min-p 0.05, repeat
penalty 1.1 over the last 64 tokens); --temp 0 decodes greedily, and --seed makes a sampled run
repeat exactly.

With --json, stdout holds exactly one JSON object (the prompt, the text and the run's statistics)
and the text streams to stderr instead.

examples:
  edgeflash generate -m smollm2-135m --chat -p "Name three rivers."
  edgeflash generate -p "The sea at night" -n 64 --temp 0
  edgeflash generate -m model.gguf --prompt-file story.txt -n 128 --seed 1 --json
"""


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("generate", help=HELP, description=DESCRIPTION,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_option(p)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("-p", "--prompt", help="the prompt text")
    src.add_argument("--prompt-file", type=Path, help="read the prompt from this file")
    p.add_argument("-n", "--max-tokens", type=non_negative_int, default=64,
                   help="maximum tokens to generate (default: %(default)s)")
    p.add_argument("--chat", action="store_true",
                   help="wrap the prompt as a user message in the model's chat format")
    add_everyday_sampling_options(p)
    add_everyday_engine_options(p)
    p.add_argument("--json", action="store_true",
                   help="print one JSON object (prompt, text, statistics) on stdout; the text streams to stderr")
    add_advanced_sampling_options(p)
    add_advanced_engine_options(p)
    add_rank_options(p)
    p.set_defaults(run=run)


def read_prompt(args: argparse.Namespace) -> str:
    if args.prompt is not None:
        return args.prompt
    try:
        return args.prompt_file.read_text(encoding="utf-8")
    except OSError as e:
        raise UserError(f"{args.prompt_file}: cannot read the prompt file ({e.strerror})") from None


def memory_stats(stats: dict[str, Any], baseline: int) -> dict[str, Any]:
    """What the budget covers: the process's peak RSS minus its RSS before the model loaded (the
    interpreter and libraries, which no budget can shrink)."""
    out = {"baseline_rss_bytes": baseline}
    budget = stats.get("memory_budget_bytes")
    if budget:
        out["budget_used_bytes"] = stats["peak_rss_bytes"] - baseline
    return out


def summary_line(stats: dict[str, Any]) -> str:
    mib = 2**20
    decode = stats.get("decode_tok_s")
    line = (f"[{stats['engine']}] prompt {stats['prompt_tokens']} tok at {stats['prefill_tok_s']} tok/s, generated "
            f"{stats['generated_tokens']} tok at {decode if decode is not None else '-'} tok/s, peak RSS "
            f"{stats['peak_rss_bytes'] / mib:.0f} MiB")
    if stats.get("memory_budget_bytes"):
        line += (f" = {stats['baseline_rss_bytes'] / mib:.0f} MiB before loading + "
                 f"{stats['budget_used_bytes'] / mib:.1f} MiB of the "
                 f"{stats['memory_budget_bytes'] / mib:.1f} MiB budget")
    else:
        line += f" ({stats['baseline_rss_bytes'] / mib:.0f} MiB before loading)"
    return line


def run(args: argparse.Namespace) -> int:
    import edgeflash as ef
    import edgeflash.api  # noqa: F401  (everything a load needs, so the baseline below is the loader's)
    from edgeflash.base.rss import current_rss_bytes
    from edgeflash.runtime.distributed.comm import launched_by_mpi

    prompt = read_prompt(args)
    if launched_by_mpi():  # one rank of a split model (edgeflash export --ranks N)
        return generate_on_ranks(args, prompt, memory_stats, summary_line)
    baseline = current_rss_bytes()
    t0 = time.perf_counter()
    model = ef.load(args.model, **load_kwargs(args))
    load_s = time.perf_counter() - t0
    plan = getattr(model.engine, "plan", None)
    if plan is not None:
        sys.stderr.write(plan.describe() + "\n")
    if args.chat:
        warn_without_chat_template(model)
    prompt_ids = model.chat_prompt([{"role": "user", "content": prompt}]) if args.chat else model.encode(prompt)
    generation = model.generation(prompt_ids, args.max_tokens, **sampling_kwargs(args))
    text_out = sys.stderr if args.json else sys.stdout
    if not args.chat:
        text_out.write(prompt)
    for piece in generation:
        text_out.write(piece)
        text_out.flush()
    text_out.write("\n")
    text_out.flush()
    result = generation.result()
    stats = {"model": model.name, "load_s": round(load_s, 3), **result.stats}
    stats.update(memory_stats(stats, baseline))
    if args.json:
        sys.stdout.write(json.dumps({"prompt": prompt, "text": result.text, **stats}) + "\n")
    else:
        sys.stderr.write(summary_line(stats) + "\n")
    return 0
