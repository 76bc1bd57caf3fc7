"""A layer's dense FFN from a bundle's neuron arena (q4_0 gate/up rows, q5_0 down columns), three
ways, cycling over `layers` copies so the bytes come from DRAM as in a decode step (one token, CPU
time of this process, median of 7 passes):

  ffn_sparse over every neuron | the arena's strided rows (gate, up) + matmul_columns (down) |
  gate and up copied into panels + matmul_columns | matmul_columns alone

  python benchmarks/kernels/arena_ffn.py [threads] [layers]      # default 1 thread, 24 layers
"""

from __future__ import annotations

import sys
import time

import edgeflash.kernels as k
import numpy as np
from edgeflash.kernels import _native
from edgeflash.kernels.ffn import ffn_sparse, pack_bundles


def cpu_ms(fn, reps: int = 7) -> float:
    fn()
    ts = []
    for _ in range(reps):
        t0 = time.process_time()
        fn()
        ts.append(time.process_time() - t0)
    return float(np.median(ts)) * 1e3


def run_shape(dm: int, dff: int, threads: int, layers: int, rng: np.random.Generator) -> None:
    g, u = (rng.standard_normal((dff, dm)).astype(np.float32) for _ in range(2))
    d = rng.standard_normal((dm, dff)).astype(np.float32)
    x = rng.standard_normal((1, dm)).astype(np.float32)
    a0 = pack_bundles(g, u, d, "q4_0", "q4_0", "q5_0")
    arenas = [a0.copy() for _ in range(layers)]
    slots = np.arange(dff, dtype=np.int32)
    out = np.empty((1, dm), np.float32)
    rb, rbd, stride = k.row_bytes("q4_0", dm), k.row_bytes("q5_0", dm), a0.shape[1]
    gy, uy = np.empty((1, dff), np.float32), np.empty((1, dff), np.float32)

    def sparse():
        for a in arenas:
            ffn_sparse(a, x, slots, d_model=dm, gate_fmt="q4_0", up_fmt="q4_0", down_fmt="q5_0", out=out)

    def strided():
        for a in arenas:
            flat = a.reshape(-1)
            _native.matmul(flat, "q4_0", dff, dm, stride, x, 1, gy, False)
            _native.matmul(flat[rb:], "q4_0", dff, dm, stride, x, 1, uy, False)
            _native.matmul_columns(flat[2 * rb:], "q5_0", dff, dm, stride, gy * uy, 1, out)

    laid = [(k.pack_panels(np.ascontiguousarray(a[:, :rb]), "q4_0", dm),
             k.pack_panels(np.ascontiguousarray(a[:, rb:2 * rb]), "q4_0", dm),
             np.ascontiguousarray(a[:, 2 * rb:2 * rb + rbd])) for a in arenas]

    def panels():
        for gp, up, dc in laid:
            h = k.matmul_panels(gp, "q4_0", dff, dm, x) * k.matmul_panels(up, "q4_0", dff, dm, x)
            k.matmul_columns(dc, "q5_0", h, out=out)

    def columns():
        for _, _, dc in laid:
            k.matmul_columns(dc, "q5_0", gy, out=out)

    mb = a0.nbytes * layers / 1e6
    times = {name: cpu_ms(fn) for name, fn in (("ffn_sparse", sparse), ("strided rows + columns", strided),
                                                ("panels + columns", panels), ("columns alone", columns))}
    print(f"{dm}x{dff}, {threads} thread(s), {layers} layers ({mb:.0f} MB): " +
          " | ".join(f"{n} {t:.1f} ms" for n, t in times.items()), flush=True)


def main() -> None:
    threads = int(sys.argv[1]) if len(sys.argv) > 1 else 1
    layers = int(sys.argv[2]) if len(sys.argv) > 2 else 24
    k.set_num_threads(threads)
    rng = np.random.default_rng(0)
    for dm, dff in ((896, 4864), (1536, 8960)):
        run_shape(dm, dff, threads, layers, rng)


if __name__ == "__main__":
    main()
