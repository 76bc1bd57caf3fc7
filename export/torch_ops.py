"""The family forward functions on torch, one layer at a time, recording what calibration needs.

The families (runtime/families) write a block once against an `Ops` protocol; here the ops are
torch (float32, the CPU's BLAS on every thread the export may use) so the unquantized source runs
over the calibration windows fast. Weights are dequantized when a layer first uses them and
dropped with `release()`, so only one layer's float weights exist at a time.

While running, `LayerRecorder` keeps per weight the sum of x^2 over the tokens that multiplied it
(the calibrated quantizers' importance), the FFN gate pre-activations (sparsity thresholds and the
hot-first order) and optionally the FFN inputs (predictor fitting).
"""

from __future__ import annotations

import re
import threading

import numpy as np
import torch
from edgeflash.runtime.tensors import Tensor

_GATE = re.compile(r"^blk\.(\d+)\.ffn_gate\.weight$")


def dense_values(t: Tensor) -> np.ndarray:
    """float32 values of any tensor in its logical shape (native dequantization where it exists)."""
    from edgeflash.export.quant.methods import dequantize_matrix

    if len(t.shape) == 1:
        return t.dequantize().reshape(-1)
    return dequantize_matrix(t.raw, t.fmt, t.cols).reshape(t.shape)


class WindowContext:
    """ForwardContext of one window processed in one call (positions 0..T-1, no cache kept)."""

    def __init__(self, inv_freq: list[np.ndarray], n_tokens: int):
        self._inv_freq = inv_freq
        self.positions = torch.arange(n_tokens)
        self.mask = None

    def inv_freq(self, layer: int) -> np.ndarray:
        return self._inv_freq[layer]

    def store_kv(self, layer: int, k: torch.Tensor, v: torch.Tensor):
        return k.transpose(0, 1), v.transpose(0, 1), self.positions  # [T, Hkv, D] -> [Hkv, T, D]


class TorchOps:
    """The `Ops` protocol on torch float32 activations. `weight()` dequantizes on first use (by
    name: tensors that are views made per call share it) and keeps the result until `release()`:
    vectors in float32, matrices in bfloat16, which `linear` multiplies with bfloat16 inputs and
    float32 accumulation. On CPUs with AVX-512 BF16 that is 5x the float32 rate (132 against 27
    GFLOP/s for a [512, 1536] x [1536, 8960] product on one core here) at half the memory; the
    weights are 4-6-bit values already, and the statistics taken from the products (E[x^2],
    quantiles) move by well under 1%. Op sets made with `shares=` use the same weights (one op set
    per worker thread)."""

    def __init__(self, shares: TorchOps | None = None) -> None:
        self._weights: dict[str, torch.Tensor] = shares._weights if shares is not None else {}
        self._lock = shares._lock if shares is not None else threading.Lock()

    def weight(self, t: Tensor) -> torch.Tensor:
        w = self._weights.get(t.name)
        if w is None:
            with self._lock:  # one dequantization per weight, whichever worker asks first
                w = self._weights.get(t.name)
                if w is None:
                    w = torch.from_numpy(np.ascontiguousarray(dense_values(t)))
                    w = self._weights[t.name] = w.to(torch.bfloat16) if w.dim() > 1 else w
        return w

    def release(self) -> None:
        self._weights.clear()

    def embed(self, tokens: np.ndarray, table: Tensor, scale: float) -> torch.Tensor:
        from edgeflash.export.quant.methods import dequantize_matrix

        rows = dequantize_matrix(table.raw[np.asarray(tokens, dtype=np.int64)], table.fmt, table.cols)  # [T, d]
        out = torch.from_numpy(rows)
        return out * scale if scale != 1.0 else out

    def linear(self, x: torch.Tensor, w: Tensor, bias: Tensor | None = None) -> torch.Tensor:
        y = (x.to(torch.bfloat16) @ self.weight(w).T).float()
        return y + self.weight(bias) if bias is not None else y

    def rms_norm(self, x: torch.Tensor, w: Tensor, eps: float) -> torch.Tensor:
        return x * torch.rsqrt(x.square().mean(dim=-1, keepdim=True) + eps) * self.weight(w)

    def rope(self, x: torch.Tensor, positions: torch.Tensor, inv_freq: np.ndarray) -> torch.Tensor:
        """Rotate-half RoPE on the first 2 * len(inv_freq) dims of each head. x: [T, H, D]."""
        half = len(inv_freq)
        angles = positions.to(torch.float64)[:, None] * torch.from_numpy(np.asarray(inv_freq))[None, :]  # [T, half]
        cos, sin = angles.cos().float()[:, None, :], angles.sin().float()[:, None, :]  # [T, 1, half]
        x1, x2 = x[..., :half], x[..., half:2 * half]
        rotated = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)
        return torch.cat([rotated, x[..., 2 * half:]], dim=-1) if x.shape[-1] > 2 * half else rotated

    def gated(self, gate: torch.Tensor, up: torch.Tensor, activation: str) -> torch.Tensor:
        return activate(gate, activation) * up

    def attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_pos: torch.Tensor,
                  k_pos: torch.Tensor, window: int, scale: float, mask=None) -> torch.Tensor:
        """q: [T, H, D]; k, v: [Hkv, S, D] -> [T, H, D] (causal, optionally sliding)."""
        group = q.shape[1] // k.shape[0]
        visible = k_pos[None, :] <= q_pos[:, None]  # [T, S]
        if window:
            visible &= (q_pos[:, None] - k_pos[None, :]) < window
        out = torch.nn.functional.scaled_dot_product_attention(
            q.transpose(0, 1), k.repeat_interleave(group, dim=0), v.repeat_interleave(group, dim=0),
            attn_mask=visible, scale=float(scale))  # [H, T, D]
        return out.transpose(0, 1)


def activate(g: torch.Tensor, kind: str) -> torch.Tensor:
    """act(g) of the gated FFN: SiLU or tanh-GELU (the families' two)."""
    return torch.nn.functional.silu(g) if kind == "silu" else torch.nn.functional.gelu(g, approximate="tanh")


class LayerRecorder(TorchOps):
    """TorchOps that records, per weight, sum(x^2) over its input tokens; per layer the FFN gate
    pre-activations (float16) and, with `keep_ffn_inputs`, the FFN inputs (float16), by window
    (`window` is the one being run), so that workers' records merge in window order."""

    def __init__(self, keep_ffn_inputs: bool = False, shares: TorchOps | None = None):
        super().__init__(shares)
        self.sumsq: dict[str, torch.Tensor] = {}
        self.count: dict[str, int] = {}
        self.keep_ffn_inputs = keep_ffn_inputs
        self.window = 0
        self.gate_pre: dict[int, torch.Tensor] = {}  # window -> [T, d_ff]
        self.ffn_inputs: dict[int, torch.Tensor] = {}

    def record_input(self, name: str, x: torch.Tensor) -> None:
        x2 = x.double().square().sum(dim=0)  # [cols]
        if name in self.sumsq:
            self.sumsq[name] += x2
            self.count[name] += x.shape[0]
        else:
            self.sumsq[name], self.count[name] = x2, x.shape[0]

    def linear(self, x: torch.Tensor, w: Tensor, bias: Tensor | None = None) -> torch.Tensor:
        x2d = x.reshape(-1, x.shape[-1])
        if not (w.name.endswith(("attn_k.weight", "attn_v.weight", "ffn_up.weight"))):
            self.record_input(w.name, x2d)  # k/v share q's input, up shares gate's: recorded once
        y = super().linear(x, w, bias)
        if _GATE.match(w.name):
            self.gate_pre[self.window] = y.reshape(-1, y.shape[-1]).half()
            if self.keep_ffn_inputs:
                self.ffn_inputs[self.window] = x2d.half()
        return y


def take_layer(recorders: list[LayerRecorder]) -> tuple[dict[str, np.ndarray], torch.Tensor, torch.Tensor | None]:
    """(importance: E[x^2] per input column of every matrix, gate pre-activations [T, d_ff], FFN
    inputs [T, d_model] or None) of the layer the recorders just ran, merged in window order;
    clears the records and the layer's weights."""
    sums: dict[str, torch.Tensor] = {}
    counts: dict[str, int] = {}
    gate: dict[int, torch.Tensor] = {}
    inputs: dict[int, torch.Tensor] = {}
    for r in recorders:
        for name, s in r.sumsq.items():
            sums[name] = sums[name] + s if name in sums else s
            counts[name] = counts.get(name, 0) + r.count[name]
        gate.update(r.gate_pre)
        inputs.update(r.ffn_inputs)
        r.sumsq, r.count, r.gate_pre, r.ffn_inputs = {}, {}, {}, {}
        r.release()
    importance = {}
    for name, s in sums.items():
        e = (s / max(counts[name], 1)).numpy()
        importance[name] = e
        kind = name.rsplit(".", 2)[-2]
        for shared_by in _SHARED_INPUT.get(kind, ()):
            importance[name.replace(kind, shared_by)] = e
    g = torch.cat([gate[i] for i in sorted(gate)]) if gate else torch.empty(0)
    x = torch.cat([inputs[i] for i in sorted(inputs)]) if inputs else None
    return importance, g, x


# Matrices that read the same input as the recorded one (the q/k/v and gate/up projections).
_SHARED_INPUT = {"attn_q": ("attn_k", "attn_v"), "ffn_gate": ("ffn_up",)}
