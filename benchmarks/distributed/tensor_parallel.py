"""One process streaming a whole model under a budget against N ranks (boards of the namespace
harness, Ethernet links) each holding a 1/N share under the same budget, side by side in one run.

    python benchmarks/models/make_random_gguf.py --shape qwen2-7b --out bench-out/models/random-qwen2-7b.gguf
    edgeflash export bench-out/models/random-qwen2-7b.gguf -o bench-out/scaleout/q7b-r4 --ranks 4
    sudo .venv/bin/python benchmarks/distributed/tensor_parallel.py --model bench-out/models/random-qwen2-7b.gguf \\
        --split 4=bench-out/scaleout/q7b-r4 --budget-share 0.25 --tokens 16

The budget is a share of the model's weight bytes (the same number for the one process and for
every rank). Every configuration decodes greedily from the same prompt; the tokens must be equal.

This machine has 2 cores: the one process uses both (2 threads); N ranks share them (1 thread
each), so both configurations get the same CPU, and the ranks' gain comes from memory (each rank
keeps its share resident instead of reading it from flash every token). For boards with a core
each, the run reports every rank's CPU time per token (process CPU time, which a rank waiting on
its peers does not accumulate with --comm-wait poll) and its time in all-reduces, and projects a
token on one core per board as the slowest rank's CPU time and flash waits per token, plus its
all-reduces at the latency measured on the same boards right after the run (nothing else of this
benchmark running), plus the logit rows crossing the link. Records go to benchmarks/results/scale-out.jsonl.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(ROOT / "tests" / "distributed"))
sys.path.insert(0, str(ROOT / "benchmarks" / "results"))

import boards
from record import append_result, new_run_id

MPI_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
PROMPT = "def fibonacci(n):"
PREFIX = "efbench"


def _json(done: subprocess.CompletedProcess) -> dict:
    for line in done.stdout.splitlines():
        if line.startswith("{"):
            return json.loads(line)
    raise RuntimeError(f"exit {done.returncode}:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}")


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def generate_args(model: str, budget: int, tokens: int, threads: int) -> list[str]:
    return [sys.executable, "-m", "edgeflash.cli.main", "generate", "-m", model, "-p", PROMPT, "-n", str(tokens),
            "--temp", "0", "--memory-budget", str(budget), "--threads", str(threads), "--json"]


def run_single(model: str, budget: int, tokens: int) -> dict:
    done = subprocess.run(generate_args(model, budget, tokens, 2), check=False, capture_output=True, text=True,
                          timeout=3600)
    return _json(done)


def run_ranks(split: str, n: int, budget: int, tokens: int, link: str, wait: str, pin: bool = False
              ) -> tuple[dict, float, float, dict]:
    """(rank 0's JSON with every rank's statistics, the link's ping round trip in ms, the switch's CPU s,
    all-reduce latency in us by vector size on the same boards with nothing else running on them)."""
    boards.up(n, link, PREFIX)
    try:
        rtt = boards.ping_ms(0, n - 1, count=30, prefix=PREFIX)
        switch_pid = int(boards._pid_file(PREFIX).read_text())
        cpu0 = _cpu_s(switch_pid)
        command = generate_args(split, budget, tokens, 1) + ["--comm-wait", wait]
        if pin:  # rank k on core k mod cores: two ranks share a core by turns instead of migrating
            cores = os.cpu_count() or 1
            command = ["sh", "-c", f'exec taskset -c $((OMPI_COMM_WORLD_RANK % {cores})) "$@"', "rank", *command]
        cmd = boards.mpirun_command(n, command, PREFIX,
                                     extra=["--mca", "mpi_yield_when_idle", "1"] if wait == "spin" else None)
        done = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=3600,
                              env={**os.environ, **MPI_ENV})
        switch_cpu = _cpu_s(switch_pid) - cpu0
        probe = boards.mpirun_command(n, [sys.executable, str(HERE / "transports.py"), "--worker", f"mpi-{wait}"
                                          if wait == "poll" else "mpi", "--iters", "200"], PREFIX,
                                      extra=["--mca", "mpi_yield_when_idle", "1"] if wait == "spin" else None)
        latency = subprocess.run(probe, check=False, capture_output=True, text=True, timeout=600,
                                 env={**os.environ, **MPI_ENV})
        lines = [x for x in latency.stdout.splitlines() if x.startswith("RESULT ")]
        return _json(done), rtt, switch_cpu, json.loads(lines[0][7:])["latency_us"] if lines else {}
    finally:
        boards.down(PREFIX)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="the whole model (GGUF or bundle) one process runs")
    p.add_argument("--split", nargs="+", required=True, metavar="N=DIR", help="per-rank bundles for N ranks")
    p.add_argument("--budget-share", type=float, default=0.25, help="budget as a share of the weight bytes")
    p.add_argument("--tokens", type=int, default=16)
    p.add_argument("--link", default="ethernet", choices=sorted(boards.LINKS))
    p.add_argument("--name", default="random-qwen2-7b")
    p.add_argument("--comm-wait", default="poll", choices=("poll", "spin"),
                   help="how ranks wait for all-reduces (spin: MPI's own wait, yielding the core when idle)")
    p.add_argument("--pin", action="store_true", help="pin rank k to core k mod the cores (ranks sharing cores)")
    args = p.parse_args()

    from edgeflash.runtime.sources import open_model

    weight_bytes = open_model(args.model).weight_bytes
    budget = int(weight_bytes * args.budget_share)
    run_id, command = new_run_id(), " ".join(sys.argv)
    label = f"{args.budget_share:.0%} ({budget / 2**20:.0f} MiB)"

    def record(config: str, metric: str, value, unit: str = "", notes: str | None = None) -> None:
        append_result("scale-out", {"run": run_id, "model": args.name, "budget": label, "budget_mb": round(budget / 1e6),
                                    "config": config, "metric": metric, "value": value, "unit": unit,
                                    "command": command, "notes": notes})

    print(f"{args.name}: {weight_bytes / 2**30:.2f} GiB of weights, budget {label} per process", flush=True)
    t = time.perf_counter()
    single = run_single(args.model, budget, args.tokens)
    print(f"1 process: {single['decode_tok_s']} tok/s, {single.get('flash_bytes_per_token', 0) / 2**20:.0f} MiB read "
          f"a token, peak {single['budget_used_bytes'] / 2**20:.0f} MiB of the budget ({time.perf_counter() - t:.0f} s)",
          flush=True)
    record("1 process", "decode_tok_s", single["decode_tok_s"], "tok/s")
    record("1 process", "flash_mib_per_token", round(single.get("flash_bytes_per_token", 0) / 2**20, 1), "MiB")
    record("1 process", "budget_used_mib", round(single["budget_used_bytes"] / 2**20, 1), "MiB")
    for item in args.split:
        n_text, split = item.split("=", 1)
        n = int(n_text)
        t = time.perf_counter()
        out, rtt, switch_cpu, latency_us = run_ranks(split, n, budget, args.tokens, args.link, args.comm_wait,
                                                      args.pin)
        ranks = out["per_rank"]
        config = f"{n} ranks, {args.link}, {args.comm_wait}{', pinned' if args.pin else ''}"
        same = out["text"] == single["text"]  # greedy text of the same token ids
        decode = out["decode_tok_s"]
        gen = max(1, out["generated_tokens"])
        passes = gen + 1  # the prompt's pass and one per decoded token after the first
        comm = max(r["allreduce_s"] + r["logit_gather_s"] for r in ranks) / passes
        cpu = max(r["cpu_s"] for r in ranks) / passes
        # a rank on its own board: its compute (CPU time) and its waits for flash, which its peers' compute
        # does not hide here either
        busy = max(r["cpu_s"] + r.get("io_wait_s", 0.0) for r in ranks) / passes
        token_s = 1 / decode if decode else float("nan")
        run_s = out["prompt_tokens"] / out["prefill_tok_s"] + (gen - 1) / decode  # the passes comm is counted over
        # On boards with a core each nobody waits for a shared core: a token is the slowest rank's
        # compute plus its collectives at the latency measured on idle boards, plus the logit rows
        # crossing the link (every rank receives the others' rows).
        d, vocab = out.get("d_model") or 0, out.get("vocab_size") or 0
        per_call = latency_us.get(str(d), latency_us.get(d, max(latency_us.values(), default=0))) / 1e6
        calls = max(r["allreduces"] for r in ranks) / passes + 1
        link_bps = boards.LINK_BPS.get(boards.LINKS[args.link].rate or "", 0)
        gather = 4 * vocab * (n - 1) / n * 8 / link_bps if link_bps else 0.0
        projected = busy + calls * per_call + gather
        print(f"{config}: {decode} tok/s ({decode / single['decode_tok_s']:.2f}x one process), same tokens: {same}; "
              f"ping {rtt:.2f} ms; a token: {token_s * 1000:.0f} ms, of which all-reduces and logit gathers "
              f"{comm * 1000:.0f} ms ({comm * passes / run_s:.0%} of the time); slowest rank's CPU {cpu * 1000:.0f} ms a token; "
              f"switch CPU {switch_cpu:.1f} s ({time.perf_counter() - t:.0f} s)", flush=True)
        for r in ranks:
            print(f"  rank {r['rank']}: peak {r['budget_used_bytes'] / 2**20:.0f} of {r['memory_budget_bytes'] / 2**20:.0f}"
                  f" MiB (transport {r['transport_rss_bytes'] / 2**20:.1f}), read "
                  f"{r.get('flash_bytes_per_token', 0) / 2**20:.0f} MiB a token, CPU {r['cpu_s'] / passes * 1000:.0f} ms"
                  f" a token, all-reduce {r['allreduce_s'] / passes * 1000:.0f} ms a token ({r['allreduces']} calls)",
                  flush=True)
            record(config, f"rank{r['rank']}_budget_used_mib", round(r["budget_used_bytes"] / 2**20, 1), "MiB")
            record(config, f"rank{r['rank']}_cpu_ms_per_token", round(r["cpu_s"] / passes * 1000, 1), "ms")
        record(config, "decode_tok_s", decode, "tok/s", f"ping round trip {rtt:.2f} ms")
        record(config, "vs_one_process", round(decode / single["decode_tok_s"], 2), "x")
        record(config, "same_tokens", same)
        record(config, "comm_share", round(comm * passes / run_s, 3), "",
               "time in all-reduces and logit gathers (waiting for the other ranks included), slowest rank")
        record(config, "comm_ms_per_token", round(comm * 1000, 1), "ms")
        record(config, "max_rank_cpu_ms_per_token", round(cpu * 1000, 1), "ms")
        record(config, "allreduce_us_idle_boards", round(per_call * 1e6, 1), "us",
               f"{d} floats, back to back, on the same boards after the run")
        record(config, "projected_tok_s_one_core_per_board", round(1 / projected, 2), "tok/s",
               "slowest rank's CPU and flash waits a token + all-reduces a token x their latency on idle "
               "boards + logit rows on the link")
        print(f"  all-reduce of {d} floats on idle boards: {per_call * 1e6:.0f} us; one core per board: "
              f"{projected * 1000:.0f} ms a token = {1 / projected:.2f} tok/s "
              f"({1 / projected / single['decode_tok_s']:.1f}x one process here)", flush=True)
        record(config, "switch_cpu_s", round(switch_cpu, 1), "s")
        record(config, "max_rank_budget_used_mib", round(max(r["budget_used_bytes"] for r in ranks) / 2**20, 1), "MiB")
        record(config, "max_rank_flash_mib_per_token",
               round(max(r.get("flash_bytes_per_token", 0) for r in ranks) / 2**20, 1), "MiB")


if __name__ == "__main__":
    main()
