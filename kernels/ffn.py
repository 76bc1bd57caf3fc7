"""Sparse FFN over an arena of neuron bundles (layout in docs/weight-formats.md).

Slot i of an arena holds, contiguously, gate row i, up row i and down column i of one FFN
neuron, each quantized as a row of d_model elements, at byte offset i * stride.
"""

from __future__ import annotations

import numpy as np

from . import _native
from ._arrays import array, index_array, out_array
from .formats import bundle_bytes, check_cols
from .linear import quantize

ACTIVATIONS = ("silu", "gelu_tanh")


def _check_act(act: str) -> str:
    if act not in ACTIVATIONS:
        raise ValueError(f"act must be one of {', '.join(ACTIVATIONS)}, got {act!r}")
    return act


def pack_bundles(gate: np.ndarray, up: np.ndarray, down: np.ndarray, gate_fmt: str = "q8_0", up_fmt: str = "q8_0",
                 down_fmt: str = "q8_0", stride: int | None = None) -> np.ndarray:
    """Builds an arena [d_ff, stride] from float32 gate [d_ff, d_model], up [d_ff, d_model] and
    down [d_model, d_ff] (the torch Linear layouts): bundle i = gate[i], up[i], down[:, i]."""
    gate = array("gate", gate, np.float32, 2)
    up = array("up", up, np.float32, 2)
    down = array("down", down, np.float32, 2)
    d_ff, d_model = gate.shape
    if up.shape != (d_ff, d_model) or down.shape != (d_model, d_ff):
        raise ValueError(f"expected up {(d_ff, d_model)} and down {(d_model, d_ff)}, got {up.shape} and {down.shape}")
    need = bundle_bytes(d_model, gate_fmt, up_fmt, down_fmt)
    stride = need if stride is None else int(stride)
    if stride < need:
        raise ValueError(f"stride {stride} is below the bundle size {need}")
    arena = np.zeros((d_ff, stride), dtype=np.uint8)
    parts = (quantize(gate, gate_fmt), quantize(up, up_fmt), quantize(np.ascontiguousarray(down.T), down_fmt))
    offset = 0
    for p in parts:
        arena[:, offset:offset + p.shape[1]] = p
        offset += p.shape[1]
    return arena


def ffn_sparse(arena: np.ndarray, x: np.ndarray, slots: object, *, d_model: int, gate_fmt: str, up_fmt: str,
               down_fmt: str, act: str = "silu", thresholds: np.ndarray | None = None,
               out: np.ndarray | None = None, accumulate: bool = False) -> np.ndarray:
    """out[t] (+)= sum over slots s of act(gate_s . x_t) * (up_s . x_t) * down_s.

    arena: uint8 [n_slots, stride]; x: float32 [n_tok, d_model]; slots: int indices into the
    arena (repeats count again). thresholds: float32 [n_tok]; neuron s is skipped for token t
    when |act(gate_s . x_t)| < thresholds[t] (calibrated CATS-style sparsity).
    """
    for name, f in (("gate_fmt", gate_fmt), ("up_fmt", up_fmt), ("down_fmt", down_fmt)):
        check_cols(f, d_model, f"d_model for {name}={f}")
    _check_act(act)
    arena = array("arena", arena, np.uint8, 2)
    n_slots, stride = arena.shape
    need = bundle_bytes(d_model, gate_fmt, up_fmt, down_fmt)
    if stride < need:
        raise ValueError(f"arena rows have {stride} bytes, a {gate_fmt}/{up_fmt}/{down_fmt} bundle of d_model "
                         f"{d_model} takes {need}")
    x = array("x", x, np.float32, 2)
    n_tok = x.shape[0]
    if x.shape[1] != d_model or n_tok == 0:
        raise ValueError(f"x must have shape [n_tok >= 1, {d_model}], got {x.shape}")
    ids = index_array("slots", slots, n_slots)
    thr = None
    if thresholds is not None:
        thr = array("thresholds", thresholds, np.float32, 1)
        if thr.shape != (n_tok,):
            raise ValueError(f"thresholds must have shape ({n_tok},), got {thr.shape}")
    if out is None:
        if accumulate:
            raise ValueError("accumulate=True needs an out buffer to add to")
        out = np.empty((n_tok, d_model), dtype=np.float32)
    else:
        out = out_array("out", out, (n_tok, d_model), inputs=(("x", x), ("arena", arena)))
    _native.ffn_sparse(arena, n_slots, d_model, gate_fmt, up_fmt, down_fmt, stride, x, n_tok, ids, act, thr, out,
                       bool(accumulate))
    return out
