"""Numpy implementations of every op a forward pass uses, written for clarity, in float32."""

from __future__ import annotations

import numpy as np
from edgeflash.runtime.tensors import Tensor


class NumpyOps:
    """Weights are dequantized to float32 on first use and kept (the oracle trades memory for clarity)."""

    def __init__(self) -> None:
        self._dense: dict[int, np.ndarray] = {}

    def weight(self, t: Tensor) -> np.ndarray:
        key = id(t)
        if key not in self._dense:
            self._dense[key] = t.dequantize()
        return self._dense[key]

    def embed(self, tokens: np.ndarray, table: Tensor, scale: float) -> np.ndarray:
        # Dequantize only the rows needed: the table may be the largest tensor of the model.
        rows = table.take_rows(np.asarray(tokens, dtype=np.int64)).dequantize()  # [T, d]
        return rows * np.float32(scale) if scale != 1.0 else rows

    def linear(self, x: np.ndarray, w: Tensor, bias: Tensor | None = None) -> np.ndarray:
        y = x @ self.weight(w).T  # [T, in] @ [in, out]
        return y + self.weight(bias) if bias is not None else y

    def rms_norm(self, x: np.ndarray, w: Tensor, eps: float) -> np.ndarray:
        ms = np.mean(np.square(x, dtype=np.float32), axis=-1, keepdims=True)
        return x / np.sqrt(ms + np.float32(eps)) * self.weight(w)

    def rope(self, x: np.ndarray, positions: np.ndarray, inv_freq: np.ndarray) -> np.ndarray:
        """Rotate-half RoPE on the first 2*len(inv_freq) dims of each head. x: [T, H, D]."""
        half = len(inv_freq)
        angles = positions.astype(np.float64)[:, None] * inv_freq[None, :]  # [T, half]
        cos = np.cos(angles).astype(np.float32)[:, None, :]  # [T, 1, half]
        sin = np.sin(angles).astype(np.float32)[:, None, :]
        x1, x2 = x[..., :half], x[..., half:2 * half]
        rotated = np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
        return np.concatenate([rotated, x[..., 2 * half:]], axis=-1) if x.shape[-1] > 2 * half else rotated

    def gated(self, gate: np.ndarray, up: np.ndarray, activation: str) -> np.ndarray:
        if activation == "silu":
            return gate / (1.0 + np.exp(-gate)) * up
        # tanh approximation of GELU (Gemma's gelu_pytorch_tanh)
        c = np.float32(np.sqrt(2.0 / np.pi))
        return 0.5 * gate * (1.0 + np.tanh(c * (gate + np.float32(0.044715) * gate ** 3))) * up

    def attention(self, q: np.ndarray, k: np.ndarray, v: np.ndarray, q_pos: np.ndarray, k_pos: np.ndarray,
                  window: int, scale: float, mask: np.ndarray | None = None) -> np.ndarray:
        """q: [T, H, D]; k, v: [Hkv, S, D]; q_pos: [T]; k_pos: [S] -> [T, H, D].

        Key j is visible to query i when k_pos[j] <= q_pos[i] and, on sliding-window layers,
        q_pos[i] - k_pos[j] < window; `mask` [T, S] further restricts it (token trees)."""
        T, H, D = q.shape
        group = H // k.shape[0]
        visible = k_pos[None, :] <= q_pos[:, None]  # [T, S]
        if window:
            visible &= (q_pos[:, None] - k_pos[None, :]) < window
        if mask is not None:
            visible &= mask
        kh = np.repeat(k, group, axis=0)  # [H, S, D]
        vh = np.repeat(v, group, axis=0)
        scores = np.einsum("thd,hsd->hts", q, kh) * np.float32(scale)  # [H, T, S]
        scores = np.where(visible[None], scores, -np.inf)
        scores -= scores.max(axis=-1, keepdims=True)
        probs = np.exp(scores)
        probs /= probs.sum(axis=-1, keepdims=True)
        return np.einsum("hts,hsd->thd", probs, vh).astype(np.float32)
