"""Commands run by every rank of a split model, started by MPI's launcher:

    edgeflash export model.gguf -o split/ --ranks 4
    mpirun -n 4 --host a,b,c,d edgeflash generate -m split/ --memory-budget 1GiB -p "..."
    mpirun -n 4 --host a,b,c,d edgeflash serve -m split/ --memory-budget 1GiB --host 0.0.0.0

Each rank opens split/rank-<k> under its own --memory-budget. `generate`: every rank runs the
same generation loop and rank 0 prints the text and statistics (with --json, every rank's).
`serve`: rank 0 runs the server and each engine call it makes is sent to the other ranks."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from typing import Any

from edgeflash.cli.args import advanced_group, load_kwargs, sampling_kwargs, warn_without_chat_template


def load_on_ranks(args: argparse.Namespace, lead: bool = False) -> tuple[Any, Any, int]:
    """(model, communicator, baseline RSS): this rank's part, the budget covering the transport too.
    `lead`: rank 0 drives and the others follow (a server), instead of all running one loop."""
    from edgeflash.api import Model
    from edgeflash.base.rss import current_rss_bytes
    from edgeflash.runtime.distributed.engine import load_rank, start_transport

    baseline = current_rss_bytes()
    comm, transport = start_transport(args.comm_wait, args.threads)
    options = load_kwargs(args)
    options.pop("engine")
    return Model(load_rank(args.model, comm, transport_rss=transport, lead=lead, **options)), comm, baseline


def generate_on_ranks(args: argparse.Namespace, prompt: str, memory_stats: Callable, summary_line: Callable) -> int:
    """`edgeflash generate` on one rank; `memory_stats` and `summary_line` are the command's own."""
    import io

    from edgeflash.base.rss import peak_rss_bytes

    t0 = time.perf_counter()
    model, comm, baseline = load_on_ranks(args)
    load_s = time.perf_counter() - t0
    lead = comm.rank == 0
    plan = getattr(model.engine.inner, "plan", None)
    if plan is not None and lead:
        sys.stderr.write(plan.describe() + "\n")
    if args.chat and lead:
        warn_without_chat_template(model)
    prompt_ids = model.chat_prompt([{"role": "user", "content": prompt}]) if args.chat else model.encode(prompt)
    generation = model.generation(prompt_ids, args.max_tokens, **sampling_kwargs(args))
    out = (sys.stderr if args.json else sys.stdout) if lead else io.StringIO()
    if not args.chat:
        out.write(prompt)
    for piece in generation:
        out.write(piece)
        out.flush()
    out.write("\n")
    out.flush()
    result = generation.result()
    stats = {"model": model.name, "load_s": round(load_s, 3), **result.stats, "peak_rss_bytes": peak_rss_bytes()}
    stats.update(memory_stats(stats, baseline))
    ranks = comm.gather(stats)
    if not lead:
        return 0
    if args.json:
        sys.stdout.write(json.dumps({"prompt": prompt, "text": result.text, **stats, "per_rank": ranks}) + "\n")
    else:
        for r in ranks:
            sys.stderr.write(f"rank {r['rank']}: " + summary_line(r) + f", all-reduce {r['allreduce_s']:.3f} s\n")
    return 0


def add_rank_options(p: argparse.ArgumentParser) -> None:
    advanced_group(p).add_argument("--comm-wait", choices=("auto", "spin", "poll"), default="auto",
                   help="under mpirun: how a rank waits for an all-reduce; auto polls when ranks share this "
                        "host's cores (default: %(default)s)")
