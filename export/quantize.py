"""The quantize stage: a ModelSource and a QuantConfig in, quantized tensors and their report out."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from edgeflash.export.progress import bar
from edgeflash.export.quant.config import QuantConfig, TensorPlan
from edgeflash.export.quant.methods import dequantize_matrix, prepare_importance, quantize_matrix
from edgeflash.runtime.source import ModelSource
from edgeflash.runtime.tensors import Tensor


@dataclass
class QuantizedTensor:
    tensor: Tensor
    plan: TensorPlan
    source_fmt: str
    sqnr_db: float | None  # None: bit-exact copy of the source
    weighted_sqnr_db: float | None  # SQNR with each column weighted by its importance

    def report(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.tensor.name, "role": self.plan.role, "format": self.tensor.fmt,
                               "method": self.plan.method, "source_format": self.source_fmt,
                               "shape": list(self.tensor.shape), "nbytes": self.tensor.nbytes,
                               "sqnr_db": _db(self.sqnr_db), "weighted_sqnr_db": _db(self.weighted_sqnr_db)}
        if self.plan.fallback_from:
            out["fallback"] = {"from": self.plan.fallback_from, "to": self.plan.format, "reason": self.plan.reason}
        return out


def _db(v: float | None) -> float | None:
    return None if v is None else (round(v, 2) if math.isfinite(v) else 999.0)


def source_values(t: Tensor) -> np.ndarray:
    """float32 [rows, cols] of any source tensor."""
    return dequantize_matrix(t.raw, t.fmt, t.cols).reshape(t.rows, t.cols)


SQNR_SAMPLE_VALUES = 1 << 20  # a report's SQNR is measured on evenly spaced rows holding about this many values


def sqnr_db(ref: np.ndarray, approx: np.ndarray, weights: np.ndarray | None = None) -> float:
    """10 log10(signal / noise) of float32 matrices `[rows, cols]`, optionally with per-column
    weights; inf when identical. Works through row chunks (no full-size float64 copies)."""
    rows = ref.shape[0]
    step = max(1, (1 << 20) // max(ref.shape[-1], 1))
    w = None if weights is None else np.sqrt(np.asarray(weights, dtype=np.float32))
    signal = noise = 0.0
    for start in range(0, rows, step):
        r = ref[start:start + step].reshape(-1, ref.shape[-1])
        e = r - approx[start:start + step].reshape(r.shape)
        if w is not None:
            r, e = r * w, e * w
        signal += float(np.dot(r.reshape(-1), r.reshape(-1)))
        noise += float(np.dot(e.reshape(-1), e.reshape(-1)))
    if noise == 0:
        return math.inf
    return 10.0 * math.log10(max(signal, 1e-300) / noise)


def quantize_tensor(t: Tensor, plan: TensorPlan, importance: np.ndarray | None,
                    values: np.ndarray | None = None) -> QuantizedTensor:
    """One tensor through its plan; `importance` (E[x^2] per input column) drives the weighted
    methods and the weighted SQNR; `values`: its float32 values when already at hand."""
    if plan.format == "keep":
        return QuantizedTensor(t, plan, t.fmt, None, None)
    values = source_values(t) if values is None else values.reshape(t.rows, t.cols)  # [rows, cols]
    imp = importance if len(t.shape) > 1 else None
    raw = quantize_matrix(values, plan.format, plan.method, imp)
    q = Tensor(t.name, plan.format, t.shape, raw)
    if plan.format == t.fmt and np.array_equal(raw, np.asarray(t.raw).reshape(raw.shape)):
        return QuantizedTensor(q, plan, t.fmt, None, None)
    rows = slice(None, None, max(1, values.size // SQNR_SAMPLE_VALUES))  # an evenly spaced sample of rows
    approx = dequantize_matrix(raw[rows], plan.format, t.cols)
    w = prepare_importance(imp, t.cols) if imp is not None else None
    sample = values[rows]
    return QuantizedTensor(q, plan, t.fmt, sqnr_db(sample, approx),
                           sqnr_db(sample, approx, w) if w is not None else None)


def quantize_model(source: ModelSource, config: QuantConfig, importance: dict[str, np.ndarray] | None,
                   progress: bool = True, desc: str = "quantize") -> dict[str, QuantizedTensor]:
    """Every tensor of an in-memory `source` through `config` (the streaming export quantizes
    layer by layer instead). `importance`: tensor name -> E[x^2] per input column."""
    importance = importance or {}
    out: dict[str, QuantizedTensor] = {}
    for name in bar(list(source.tensors), desc, progress, unit="tensor"):
        t = source.tensors[name]
        out[name] = quantize_tensor(t, config.plan(name, t.shape), importance.get(name))
    return out


def quantized_source(source: ModelSource, tensors: dict[str, QuantizedTensor], kind: str = "export") -> ModelSource:
    """The quantized model as a ModelSource (for evaluation before anything is written)."""
    return ModelSource(path=source.path, kind=kind, spec=source.spec, tokenizer=source.tokenizer,
                       tensors={n: q.tensor for n, q in tensors.items()}, info=dict(source.info))
