"""The cost model of docs/scale-out.md: a token's time on N boards from the model's shape, each
board's memory, DRAM and flash bandwidth, and the link. Prints the projection table.

    python benchmarks/distributed/cost_model.py [--dram 8 10] [--flash 0.5 1] [--budget-gib 6]

Per token, rank k of N:
  bytes it computes over   W/N            (layers and head at 4.5 bits a weight: q4_0)
  bytes it streams         max(0, W/N - R) (R: the budget left for resident weights)
  compute                  W/N / DRAM bandwidth (a decode step reads every weight once)
  flash                    streamed / flash bandwidth, overlapped with compute (prefetch)
  communication            (2 L + 1) all-reduces of d floats, each ceil(log2 N) rounds of
                           (latency + 4 d / bandwidth) (Open MPI's recursive doubling for small
                           vectors), plus the logit rows: (N-1)/N x 4 V bytes on the link
  token                    max(compute, flash) + communication
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass

BITS_PER_WEIGHT = 4.5  # q4_0
GIB = 2**30


@dataclass(frozen=True)
class Shape:
    name: str
    layers: int
    d: int
    kv_dim: int
    ffn: int
    vocab: int

    @property
    def token_bytes(self) -> float:
        """Weights a decode step reads: every layer and the head (the embedding gives one row)."""
        layer = 2 * self.d * self.d + 2 * self.kv_dim * self.d + 3 * self.d * self.ffn
        return (self.layers * layer + self.vocab * self.d) * BITS_PER_WEIGHT / 8


SHAPES = [
    Shape("1.5B (Qwen2.5-1.5B)", 28, 1536, 256, 8960, 151936),
    Shape("7B (Qwen2-7B)", 28, 3584, 512, 18944, 152064),
    Shape("70B (Llama-3-70B)", 80, 8192, 1024, 28672, 128256),
]
LINKS = {"Ethernet 1 Gbit/s": (0.15e-3, 125e6), "Wi-Fi 300 Mbit/s": (1.6e-3, 37.5e6)}  # one-way latency, bytes/s


def token_time(shape: Shape, n: int, dram: float, flash: float, resident: float, latency: float,
               bandwidth: float) -> tuple[float, float, float]:
    """(seconds a token, of which communication, bytes streamed per rank)."""
    share = shape.token_bytes / n
    streamed = max(0.0, share - resident)
    compute = share / dram
    read = streamed / flash
    comm = 0.0
    if n > 1:
        rounds = math.ceil(math.log2(n))
        allreduce = rounds * (latency + 4 * shape.d / bandwidth)
        comm = (2 * shape.layers + 1) * allreduce + latency + (n - 1) / n * 4 * shape.vocab / bandwidth
    return max(compute, read) + comm, comm, streamed


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dram", nargs=2, type=float, default=[8.0, 10.0], metavar=("LOW", "HIGH"), help="GB/s")
    p.add_argument("--flash", nargs=2, type=float, default=[0.5, 1.0], metavar=("LOW", "HIGH"), help="GB/s")
    p.add_argument("--budget-gib", type=float, default=6.0, help="a board's budget for the model")
    p.add_argument("--reserve-gib", type=float, default=0.5, help="KV cache, buffers, tokenizer, runtime")
    args = p.parse_args()
    resident = (args.budget_gib - args.reserve_gib) * GIB
    print("| model | GB a token | boards | link | GB streamed a board | communication ms | tok/s |")
    print("|---|---|---|---|---|---|---|")
    for shape in SHAPES:
        for n in (1, 4, 8):
            for link, (latency, bandwidth) in LINKS.items():
                if n == 1 and link != next(iter(LINKS)):
                    continue
                slow = token_time(shape, n, args.dram[0] * 1e9, args.flash[0] * 1e9, resident, latency, bandwidth)
                fast = token_time(shape, n, args.dram[1] * 1e9, args.flash[1] * 1e9, resident, latency, bandwidth)
                print(f"| {shape.name} | {shape.token_bytes / 1e9:.2f} | {n} | {link if n > 1 else '-'} | "
                      f"{slow[2] / 1e9:.2f} | {slow[1] * 1000:.0f} | {1 / slow[0]:.2f}-{1 / fast[0]:.2f} |")


if __name__ == "__main__":
    main()
