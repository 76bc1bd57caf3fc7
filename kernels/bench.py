"""GEMV benchmark at the Gemma 3 270M shapes: GB/s of weight bytes per format at 1 and 2
threads, next to this machine's measured memory read bandwidth and torch on the same shape.

    python -m edgeflash.kernels.bench [--threads 1,2] [--formats q4_0,q8_0] [--shapes lm_head]

The LM head (262144 x 640) streams from DRAM; the FFN matrices (2048 x 640, 640 x 2048) fit in
the L2/L3 caches, so their GB/s can exceed the DRAM bandwidth. Timings are medians; the machine
may be shared, so compare rows of one run rather than runs.
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import dataclass

import numpy as np

from . import _native
from .formats import FORMATS, format_info, row_bytes
from .runtime import available_isas, current_isa, get_num_threads, set_num_threads

SHAPES = {"lm_head": (262144, 640), "ffn_up": (2048, 640), "ffn_down": (640, 2048)}
DEFAULT_FORMATS = ("q4_0", "q8_0", "q4_1", "q5_0", "q4_k", "q6_k", "q4_lut", "f16", "f32")


@dataclass
class Row:
    shape: str
    impl: str
    fmt: str
    nbytes: int
    gbps: dict[int, float]


def random_weights(fmt: str, rows: int, cols: int, rng: np.random.Generator) -> np.ndarray:
    """Valid weights with random codes: GEMV speed does not depend on the values."""
    info = format_info(fmt)
    if fmt == "f32":
        return rng.standard_normal((rows, cols), dtype=np.float32).view(np.uint8) if rows * cols < 2**27 else \
            np.full((rows, cols), 0.01, np.float32).view(np.uint8)
    w = rng.integers(0, 256, size=(rows, row_bytes(fmt, cols)), dtype=np.uint8)
    if fmt == "f16":
        return np.full((rows, cols), 0.01, np.float16).view(np.uint8)
    scale = np.array([0.01], np.float16).view(np.uint8)
    body = w[:, info.row_header:].reshape(rows, -1, info.block_bytes)
    offsets = {"q8_0": [0], "q4_0": [0], "q5_0": [0], "q4_1": [0, 2], "q4_k": [0, 2], "q6_k": [208]}.get(fmt, [])
    for off in offsets:
        body[:, :, off], body[:, :, off + 1] = scale[0], scale[1]
    if fmt == "q4_lut":
        w[:, :4] = np.frombuffer(np.float32(0.001).tobytes(), np.uint8)
        body[:, :, 0] = 1  # block scale codes
    return w


def _median_time(fn, min_time: float = 0.25, max_reps: int = 2000) -> float:
    fn()  # warm up (scratch growth, page faults, thread wake-up)
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < 5 or (time.perf_counter() - start < min_time and len(times) < max_reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def read_bandwidth(threads: int, size_mb: int = 1024) -> float:
    """GB/s of a plain streaming read over a buffer much larger than the caches (best of 5)."""
    buf = np.ones(size_mb << 20, dtype=np.uint8)
    before = get_num_threads()
    set_num_threads(threads)
    try:
        best = min(_native.timed_read(buf) for _ in range(10))
    finally:
        set_num_threads(before)
    return buf.nbytes / best / 1e9


def bench_ours(fmt: str, rows: int, cols: int, threads_list: list[int], rng: np.random.Generator) -> tuple[int, dict[int, float]]:
    w = random_weights(fmt, rows, cols, rng)
    x = rng.standard_normal((1, cols), dtype=np.float32)
    y = np.empty((1, rows), np.float32)
    out: dict[int, float] = {}
    before = get_num_threads()
    try:
        for t in threads_list:
            set_num_threads(t)
            # the native entry directly: the engine calls the C++ API, not the Python wrapper
            sec = _median_time(lambda: _native.matmul(w, fmt, rows, cols, 0, x, 1, y, False))
            out[t] = w.nbytes / sec / 1e9
    finally:
        set_num_threads(before)
    return w.nbytes, out


def bench_torch(rows: int, cols: int, threads_list: list[int]) -> list[tuple[str, int, dict[int, float]]]:
    import torch

    results = []
    before = torch.get_num_threads()
    x = torch.randn(1, cols)
    w32 = torch.full((rows, cols), 0.01)
    cases = [("torch f32 linear", w32.numel() * 4, lambda: torch.nn.functional.linear(x, w32))]
    w16 = w32.to(torch.bfloat16)
    x16 = x.to(torch.bfloat16)
    cases.append(("torch bf16 linear", w16.numel() * 2, lambda: torch.nn.functional.linear(x16, w16)))
    if hasattr(torch, "_weight_int8pack_mm"):
        w8 = torch.randint(-127, 127, (rows, cols), dtype=torch.int8)
        sc = torch.full((rows,), 0.01)
        cases.append(("torch int8 weight-only", w8.numel() + rows * 4, lambda: torch._weight_int8pack_mm(x, w8, sc)))
    try:
        with torch.inference_mode():
            for name, nbytes, fn in cases:
                res = {}
                for t in threads_list:
                    torch.set_num_threads(t)
                    res[t] = nbytes / _median_time(fn) / 1e9
                results.append((name, nbytes, res))
    finally:
        torch.set_num_threads(before)
    return results


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="edgeflash bench kernels", description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", default="1,2", help="comma-separated thread counts (default 1,2)")
    p.add_argument("--formats", default=",".join(DEFAULT_FORMATS))
    p.add_argument("--shapes", default=",".join(SHAPES), help=f"subset of {', '.join(SHAPES)}")
    p.add_argument("--no-torch", action="store_true", help="skip the torch comparison")
    args = p.parse_args(argv)
    threads_list = [int(t) for t in args.threads.split(",")]
    fmts = args.formats.split(",")
    for f in fmts:
        if f not in FORMATS:
            p.error(f"unknown format {f!r}; choose from {', '.join(FORMATS)}")
    shapes = args.shapes.split(",")
    for s in shapes:
        if s not in SHAPES:
            p.error(f"unknown shape {s!r}; choose from {', '.join(SHAPES)}")
    rng = np.random.default_rng(0)

    print(f"kernels: level {current_isa()} (available: {', '.join(available_isas())})")
    bw = {t: read_bandwidth(t) for t in threads_list}
    print("memory read bandwidth (1 GiB streaming read): " +
          ", ".join(f"{bw[t]:.1f} GB/s @ {t} thread{'s' if t > 1 else ''}" for t in threads_list))
    torch_ok = not args.no_torch
    if torch_ok:
        try:
            import torch  # noqa: F401
        except ImportError:
            torch_ok = False
            print("torch is not installed: the torch comparison is skipped")
    cols_hdr = "".join(f"  {t}T GB/s  %bw" for t in threads_list)
    for shape in shapes:
        rows, cols = SHAPES[shape]
        print(f"\nGEMV {shape}: [{rows} x {cols}] x [{cols}]   (n = 1 token)")
        print(f"  {'implementation':<26}{'weight MB':>10}{cols_hdr}")
        for fmt in fmts:
            if cols % format_info(fmt).block_elems:
                print(f"  {'edgeflash ' + fmt:<26}{'n/a':>10}  (cols {cols} is not a multiple of {format_info(fmt).block_elems})")
                continue
            nbytes, res = bench_ours(fmt, rows, cols, threads_list, rng)
            cells = "".join(f"  {res[t]:8.1f} {100 * res[t] / bw[t]:4.0f}%" for t in threads_list)
            print(f"  {'edgeflash ' + fmt:<26}{nbytes / 1e6:10.1f}{cells}")
        if torch_ok:
            for name, nbytes, res in bench_torch(rows, cols, threads_list):
                cells = "".join(f"  {res[t]:8.1f} {100 * res[t] / bw[t]:4.0f}%" for t in threads_list)
                print(f"  {name:<26}{nbytes / 1e6:10.1f}{cells}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
