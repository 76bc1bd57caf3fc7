"""Op sets for running a model during export: calibration, evaluation, sparse-FFN evaluation.

`FastOps` is the reference runtime's NumpyOps with the same math, made fast enough to run
thousands of tokens during an export: weights dequantized by the native kernels, the gated
activation and attention on torch. `RecordingOps` also gathers the activation statistics that
calibration needs. `SparseFFNOps` zeroes FFN neurons whose activation magnitude is at or below a
per-layer threshold, to measure what activation sparsity costs.
"""

from __future__ import annotations

import re

import numpy as np
import torch
from edgeflash.export.quant.methods import dequantize_matrix
from edgeflash.export.threads import LARGE_PRODUCT_MACS, blas_threads
from edgeflash.runtime.reference.ops import NumpyOps
from edgeflash.runtime.tensors import Tensor

_GATE = re.compile(r"^blk\.(\d+)\.ffn_gate\.weight$")


def activation(g: np.ndarray, kind: str) -> np.ndarray:
    """act(g) of the gated FFN: SiLU or tanh-GELU (the families' two), float32."""
    t = torch.from_numpy(np.ascontiguousarray(g, dtype=np.float32))
    out = torch.nn.functional.silu(t) if kind == "silu" else torch.nn.functional.gelu(t, approximate="tanh")
    return out.numpy()


class FastOps(NumpyOps):
    """NumpyOps with native dequantization and torch for the gated activation and attention.

    `shared` lets several op sets over the same tensors share one cache of dequantized weights;
    `threads` is how many BLAS threads large matrix products may use (see export/threads.py)."""

    def __init__(self, shared: FastOps | None = None, threads: int = 1):
        super().__init__()
        self.threads = threads
        if shared is not None:
            self._dense = shared._dense
            self.threads = shared.threads

    def linear(self, x: np.ndarray, w: Tensor, bias: Tensor | None = None) -> np.ndarray:
        if self.threads > 1 and x.size // x.shape[-1] * w.rows * w.cols >= LARGE_PRODUCT_MACS:
            with blas_threads(self.threads):
                return super().linear(x, w, bias)
        return super().linear(x, w, bias)

    def weight(self, t: Tensor) -> np.ndarray:
        key = id(t)
        if key not in self._dense:
            self._dense[key] = dequantize_matrix(t.raw, t.fmt, t.cols).reshape(t.shape)
        return self._dense[key]

    def embed(self, tokens: np.ndarray, table: Tensor, scale: float) -> np.ndarray:
        rows = dequantize_matrix(table.raw[np.asarray(tokens, dtype=np.int64)], table.fmt, table.cols)  # [T, d]
        return rows * np.float32(scale) if scale != 1.0 else rows

    def gated(self, gate: np.ndarray, up: np.ndarray, activation_kind: str) -> np.ndarray:
        return activation(gate, activation_kind) * up

    def attention(self, q: np.ndarray, k: np.ndarray, v: np.ndarray, q_pos: np.ndarray, k_pos: np.ndarray,
                  window: int, scale: float, mask: np.ndarray | None = None) -> np.ndarray:
        """Same contract as NumpyOps.attention: q [T, H, D]; k, v [Hkv, S, D] -> [T, H, D]."""
        group = q.shape[1] // k.shape[0]
        visible = k_pos[None, :] <= q_pos[:, None]  # [T, S]
        if window:
            visible &= (q_pos[:, None] - k_pos[None, :]) < window
        if mask is not None:
            visible &= mask
        tq = torch.from_numpy(np.ascontiguousarray(q.transpose(1, 0, 2)))  # [H, T, D]
        tk = torch.from_numpy(np.ascontiguousarray(k)).repeat_interleave(group, dim=0)  # [H, S, D]
        tv = torch.from_numpy(np.ascontiguousarray(v)).repeat_interleave(group, dim=0)
        out = torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, attn_mask=torch.from_numpy(visible),
                                                               scale=float(scale))
        return out.numpy().transpose(1, 0, 2).astype(np.float32, copy=False)

    def release(self) -> None:
        """Drop the dequantized weights (hundreds of MB for a model with a large vocabulary)."""
        self._dense.clear()


class RecordingOps(FastOps):
    """FastOps that also records, per weight tensor, sum(x^2) over the tokens that multiplied it,
    and per layer the FFN gate pre-activations (and optionally the FFN inputs)."""

    def __init__(self, n_layers: int, keep_ffn_inputs: bool = False, threads: int = 1):
        super().__init__(threads=threads)
        self.sumsq: dict[str, np.ndarray] = {}
        self.count: dict[str, int] = {}
        self.gate_pre: list[list[np.ndarray]] = [[] for _ in range(n_layers)]  # float16 [T, d_ff] pieces
        self.ffn_inputs: list[list[np.ndarray]] | None = [[] for _ in range(n_layers)] if keep_ffn_inputs else None

    def record_input(self, name: str, x: np.ndarray) -> None:
        x2 = np.einsum("tc,tc->c", x, x, dtype=np.float64)  # [cols]
        if name in self.sumsq:
            self.sumsq[name] += x2
            self.count[name] += x.shape[0]
        else:
            self.sumsq[name], self.count[name] = x2, x.shape[0]

    def linear(self, x: np.ndarray, w: Tensor, bias: Tensor | None = None) -> np.ndarray:
        x2d = x.reshape(-1, x.shape[-1])
        self.record_input(w.name, x2d)
        y = super().linear(x, w, bias)
        m = _GATE.match(w.name)
        if m:
            layer = int(m.group(1))
            self.gate_pre[layer].append(y.reshape(-1, y.shape[-1]).astype(np.float16))
            if self.ffn_inputs is not None:
                self.ffn_inputs[layer].append(x2d.astype(np.float16))
        return y

    def importance(self) -> dict[str, np.ndarray]:
        """E[x^2] per input column of every weight tensor that was used."""
        return {name: self.sumsq[name] / max(self.count[name], 1) for name in self.sumsq}


class SparseFFNOps(FastOps):
    """Gated FFN with activation sparsity: act(gate) entries with |act| <= threshold[layer] are
    zeroed (CATS). The layer is known from the gate projection that ran just before `gated`."""

    def __init__(self, thresholds: list[float], shared: FastOps | None = None, threads: int = 1):
        super().__init__(shared, threads)
        self.thresholds = thresholds
        self._layer: int | None = None
        self.kept = 0  # neuron activations kept / seen, to report the sparsity reached
        self.seen = 0

    def linear(self, x: np.ndarray, w: Tensor, bias: Tensor | None = None) -> np.ndarray:
        m = _GATE.match(w.name)
        if m:
            self._layer = int(m.group(1))
        return super().linear(x, w, bias)

    def gated(self, gate: np.ndarray, up: np.ndarray, activation_kind: str) -> np.ndarray:
        if self._layer is None:
            raise RuntimeError("SparseFFNOps.gated ran before any ffn_gate projection")
        a = activation(gate, activation_kind)
        keep = np.abs(a) > self.thresholds[self._layer]
        self.kept += int(keep.sum())
        self.seen += keep.size
        self._layer = None
        return np.where(keep, a, 0.0).astype(np.float32) * up
