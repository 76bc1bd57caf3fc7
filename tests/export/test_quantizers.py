"""The packers and calibrated quantizers: bit-compatible layouts, and better weighted error than
round-to-nearest on real weights."""

from __future__ import annotations

import math

import edgeflash.kernels as kernels
import numpy as np
import pytest
from edgeflash.export.quant import quantize_matrix
from edgeflash.export.quant.q4_k import quantize_q4_k
from edgeflash.export.quant.q4_lut import quantize_q4_lut
from edgeflash.export.quantize import source_values, sqnr_db
from edgeflash.runtime.tensors import dequantize_raw


@pytest.fixture(scope="module")
def smol_tensors(smollm_path):
    from edgeflash.runtime.sources.gguf import load_gguf

    return load_gguf(smollm_path).tensors


@pytest.fixture(scope="module")
def gemma_tensors(gemma_path):
    from edgeflash.runtime.sources.gguf import load_gguf

    return load_gguf(gemma_path).tensors


def _gguf_dequantize(raw: np.ndarray, fmt: str, shape: tuple[int, int]) -> np.ndarray:
    import gguf

    qtype = {"q4_0": gguf.GGMLQuantizationType.Q4_0, "q4_1": gguf.GGMLQuantizationType.Q4_1,
             "q5_0": gguf.GGMLQuantizationType.Q5_0, "q8_0": gguf.GGMLQuantizationType.Q8_0,
             "q4_k": gguf.GGMLQuantizationType.Q4_K}[fmt]
    return gguf.quants.dequantize(raw, qtype).reshape(shape)


def _importance(cols: int, seed: int = 0) -> np.ndarray:
    # heavy-tailed like real E[x^2] profiles: a few columns dominate
    return np.random.default_rng(seed).gamma(0.4, 1.0, cols).astype(np.float32)


@pytest.mark.parametrize("fmt", ["q4_0", "q4_1", "q5_0", "q8_0", "q4_k"])
def test_weighted_output_is_bit_compatible_with_gguf(fmt):
    rng = np.random.default_rng(1)
    w = (rng.standard_normal((64, 512)) * rng.gamma(2.0, 1.0, (1, 512))).astype(np.float32)
    raw = quantize_matrix(w, fmt, "weighted", _importance(512))
    ours = kernels.dequantize(raw, fmt, 512)
    np.testing.assert_array_equal(ours, _gguf_dequantize(raw, fmt, w.shape))
    assert sqnr_db(w, ours) > {"q4_0": 15, "q4_1": 16, "q5_0": 20, "q8_0": 35, "q4_k": 16}[fmt]


@pytest.mark.parametrize("fmt,floor_db", [("q4_0", 0.3), ("q4_1", 0.5), ("q5_0", 0.3)])
def test_weighted_beats_round_to_nearest_on_real_weights(gemma_tensors, fmt, floor_db):
    for name in ("blk.4.ffn_down.weight", "blk.4.attn_output.weight"):  # q6_k, q4_k in the file
        w = source_values(gemma_tensors[name])
        imp = _importance(w.shape[1])
        weights = imp / imp.mean() + 0.01  # what prepare_importance does
        rtn = kernels.dequantize(quantize_matrix(w, fmt, "rtn"), fmt, w.shape[1])
        cal = kernels.dequantize(quantize_matrix(w, fmt, "weighted", imp), fmt, w.shape[1])
        gain = sqnr_db(w, cal, weights) - sqnr_db(w, rtn, weights)
        assert gain > floor_db, f"{fmt} {name}: weighted SQNR gain {gain:.2f} dB"


def test_q4_k_reproduces_a_real_q4_k_tensor(gemma_tensors):
    """Values that already lie on a Q4_K grid come back almost exactly: the layout is right."""
    t = gemma_tensors["blk.2.attn_output.weight"]
    assert t.fmt == "q4_k"
    w = source_values(t)
    ours = _gguf_dequantize(quantize_q4_k(w, None), "q4_k", w.shape)
    assert sqnr_db(w, ours) > 30.0


def test_q4_k_needs_rows_of_256():
    with pytest.raises(ValueError, match="multiple of 256"):
        quantize_q4_k(np.zeros((4, 640), dtype=np.float32), None)


def test_q4_lut_layout_and_kmeans(smol_tensors):
    w = source_values(smol_tensors["blk.3.ffn_up.weight"])  # [1536, 576]
    rows, cols = w.shape
    plain = quantize_q4_lut(w, None)
    assert plain.shape == (rows, 20 + cols // 32 * 17)
    decoded = dequantize_raw(plain, "q4_lut", cols)
    np.testing.assert_array_equal(decoded, kernels.dequantize(plain, "q4_lut", cols))
    # every decoded value is row scale * block code^2 * one of the row's 16 int8 levels
    levels = plain[0, 4:20].view(np.int8).astype(int)
    scale = plain[0, 0:4].copy().view(np.float32)[0]
    codes = plain[0, 20:].reshape(cols // 32, 17)[:, 0].astype(np.float32)
    block_scale = np.repeat(scale * codes * codes, 32)
    assert np.all(np.isin(np.rint(decoded[0] / block_scale).astype(int), levels))
    # without importance the exporter's fit is the kernels' own q4_lut quantizer
    np.testing.assert_array_equal(plain, kernels.quantize(w, "q4_lut"))
    # non-uniform levels beat q4_0's uniform grid at about its size (4.53 against 4.5 bits per
    # weight at rows of 576 values; 4.25 + 160 / cols in general)
    q4_0 = kernels.dequantize(kernels.quantize(w, "q4_0"), "q4_0", cols)
    assert sqnr_db(w, decoded) > sqnr_db(w, q4_0) + 0.3
    assert plain.nbytes <= 1.01 * kernels.quantize(w, "q4_0").nbytes


def test_q4_lut_weighted_kmeans_beats_uniform_on_weighted_error(smol, smol_calibration):
    # Real weights (every matrix of three layers, every fourth row), and E[x^2] of the activations
    # that meet them on calibration text. The weighted error summed over the matrices: the weighted
    # k-means against the plain one, and against calibrated q4_0 (uniform levels, per-block scales
    # searched by the same weighted error). Single early-layer FFN matrices come out about even with
    # q4_0; attention and later layers are where the non-uniform levels win.
    totals = {"plain": 0.0, "weighted": 0.0, "uniform": 0.0}
    for layer in (3, 15, 29):
        for kind in ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"):
            name = f"blk.{layer}.{kind}.weight"
            w = source_values(smol.tensors[name])[::4]
            cols = w.shape[1]
            imp = smol_calibration.importance[name]
            weights = imp / imp.mean() + 0.01  # as prepare_importance weighs the columns
            signal = float(np.sum(w * w * weights))
            fits = {"plain": ("q4_lut", "rtn", None), "weighted": ("q4_lut", "weighted", imp),
                    "uniform": ("q4_0", "weighted", imp)}
            for key, (fmt, method, importance) in fits.items():
                approx = dequantize_raw(quantize_matrix(w, fmt, method, importance), fmt, cols)
                totals[key] += float(np.sum((approx - w) ** 2 * weights)) / signal
    assert totals["weighted"] < 0.8 * totals["plain"], totals
    assert totals["weighted"] < 0.9 * totals["uniform"], totals


def test_quantize_matrix_rejects_bad_input():
    with pytest.raises(ValueError, match="NaN"):
        quantize_matrix(np.full((2, 32), np.nan, dtype=np.float32), "q4_0")
    with pytest.raises(ValueError, match="2-D"):
        quantize_matrix(np.zeros(32, dtype=np.float32), "q4_0")
    with pytest.raises(ValueError, match="no quantizer"):
        quantize_matrix(np.zeros((2, 32), dtype=np.float32), "q6_k", "rtn")
    with pytest.raises(ValueError, match="importance has 16 values"):
        quantize_matrix(np.zeros((2, 32), dtype=np.float32), "q4_0", "weighted", np.ones(16))


def test_sqnr_is_infinite_for_identical_values():
    a = np.ones((2, 4), dtype=np.float32)
    assert math.isinf(sqnr_db(a, a.copy()))
