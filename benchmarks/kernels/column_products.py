"""A layer's q8_0 down columns (a bundle arena's down step) multiplied four ways, cycling over
`layers` copies so the bytes come from DRAM as in a forward pass (CPU time of this process, median
of 7 interleaved passes, 1, 4 and 64 tokens):

  float      matmul_columns acts="f32": each column's blocks decoded to floats, scaled by h
  int8 q8    column panels (pack_columns), coefficients h x block scale quantized to int8
  int8 q8x2  the same with the residual quantized once more (the engine's default activations)
  dense      the same bytes as a row-layout down matrix in panels (a dense FFN's down GEMV)

  python benchmarks/kernels/column_products.py [threads] [layers]     # default 1 thread, 24 layers
"""

from __future__ import annotations

import os
import sys
import time

import numpy as np
from edgeflash.kernels import _native
from edgeflash.kernels.linear import matmul_columns, matmul_panels, pack_panels, quantize
from edgeflash.kernels.runtime import set_num_threads


def passes(h: np.ndarray, y: np.ndarray, as_cols, as_packed, as_dense, dm: int, dff: int) -> dict:
    """One pass over every layer copy, per way of multiplying."""
    n = h.shape[0]

    def int8(acts: str):
        return lambda: [_native.matmul_columns(p, "q8_0", dff, dm, 0, h, n, y, acts, True) for p in as_packed]

    return {"float": lambda: [matmul_columns(c, "q8_0", h, out=y) for c in as_cols], "int8 q8": int8("q8"),
            "int8 q8x2": int8("q8x2"), "dense": lambda: [matmul_panels(w, "q8_0", dm, dff, h) for w in as_dense]}


def run_shape(dm: int, dff: int, threads: int, layers: int, rng: np.random.Generator) -> None:
    d = rng.standard_normal((dm, dff)).astype(np.float32)
    cols = quantize(np.ascontiguousarray(d.T), "q8_0")  # [dff, dm]: row r = neuron r's down column
    packed = np.empty_like(cols)
    _native.pack_columns(cols, "q8_0", dff, dm, packed)
    dense = pack_panels(quantize(d, "q8_0"), "q8_0", dff)
    as_cols = [cols.copy() for _ in range(layers)]
    as_packed = [packed.copy() for _ in range(layers)]
    as_dense = [dense.copy() for _ in range(layers)]
    for n in (1, 4, 64):
        h = rng.standard_normal((n, dff)).astype(np.float32)
        runs = passes(h, np.empty((n, dm), np.float32), as_cols, as_packed, as_dense, dm, dff)
        times: dict[str, list[float]] = {name: [] for name in runs}
        for _ in range(7):
            for name, fn in runs.items():
                t0 = time.process_time()
                fn()
                times[name].append(time.process_time() - t0)
        gb = cols.nbytes * layers / 1e9
        print(f"{dm}x{dff} q8_0, {n} token(s), {threads} thread(s), {layers} layers: " + " | ".join(
            f"{name} {np.median(t) * 1e3:.2f} ms ({gb / np.median(t):.1f} GB/s)" for name, t in times.items()),
              flush=True)


def main() -> None:
    threads = int(sys.argv[1]) if len(sys.argv) > 1 else 1
    layers = int(sys.argv[2]) if len(sys.argv) > 2 else 24
    set_num_threads(threads)
    rng = np.random.default_rng(0)
    for dm, dff in ((896, 4864), (1536, 8960)):
        run_shape(dm, dff, threads, layers, rng)
    print(f"load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
