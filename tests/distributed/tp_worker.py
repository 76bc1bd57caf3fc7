"""One rank of a tensor-parallel run (started by mpirun from the tests): greedy tokens of a prompt,
and on rank 0 one JSON line with every rank's tokens and statistics."""

from __future__ import annotations

import argparse
import json

from edgeflash.api import Model
from edgeflash.base.rss import current_rss_bytes, peak_rss_bytes
from edgeflash.runtime.distributed.engine import load_rank, start_transport


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("model")
    p.add_argument("--prompt", default="The quick brown fox")
    p.add_argument("-n", type=int, default=16)
    p.add_argument("--memory-budget")
    p.add_argument("--wait", default="auto")
    args = p.parse_args()
    baseline = current_rss_bytes()
    comm, transport = start_transport(args.wait)
    model = Model(load_rank(args.model, comm, memory_budget=args.memory_budget, transport_rss=transport))
    result = model.generate(args.prompt, max_tokens=args.n, temperature=0.0)
    stats = dict(model.engine.stats(), tokens=result.tokens, baseline_rss=baseline,
                 budget_used=peak_rss_bytes() - baseline)
    everyone = comm.gather(stats)
    if comm.rank == 0:
        print("RESULT " + json.dumps(everyone), flush=True)


if __name__ == "__main__":
    main()
