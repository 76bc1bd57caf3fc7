"""The reference forward pass with chosen ops running on the native kernels, one op at a time:
every kernel is then checked inside a real model against the numpy op it replaces."""

from __future__ import annotations

import numpy as np
from edgeflash.runtime.reference.ops import NumpyOps
from edgeflash.runtime.tensors import Tensor

KERNEL_OPS = ("embed", "linear", "rms_norm", "rope", "gated", "attention")


class KernelOps(NumpyOps):
    """NumpyOps whose ops named in `use` call edgeflash.kernels instead.

    linear runs on the raw quantized weights (`precise=True`: f32 activations, the same math as
    numpy; False: Q8 activations as the engine's fastest mode); attention stores keys/values in an
    f16 cache as the engine does (compare with a reference whose kv_dtype is f16)."""

    def __init__(self, use: tuple[str, ...] = KERNEL_OPS, precise: bool = True):
        super().__init__()
        unknown = set(use) - set(KERNEL_OPS)
        if unknown:
            raise ValueError(f"unknown kernel ops {sorted(unknown)}; choose from {KERNEL_OPS}")
        import edgeflash.kernels as kernels

        self.k, self.use, self.precise = kernels, set(use), precise
        self._vectors: dict[int, np.ndarray] = {}

    def _vector(self, t: Tensor) -> np.ndarray:
        if id(t) not in self._vectors:
            self._vectors[id(t)] = np.ascontiguousarray(t.dequantize().reshape(-1), dtype=np.float32)
        return self._vectors[id(t)]

    def embed(self, tokens, table, scale):
        if "embed" not in self.use:
            return super().embed(tokens, table, scale)
        rows = self.k.dequantize(table.raw, table.fmt, table.cols, rows=np.asarray(tokens, dtype=np.int32))
        return rows * np.float32(scale) if scale != 1.0 else rows

    def linear(self, x, w, bias=None):
        if "linear" not in self.use:
            return super().linear(x, w, bias)
        y = self.k.matmul(w.raw, w.fmt, np.ascontiguousarray(x, dtype=np.float32), precise=self.precise)
        return y + self._vector(bias) if bias is not None else y

    def rms_norm(self, x, w, eps):
        if "rms_norm" not in self.use:
            return super().rms_norm(x, w, eps)
        x2 = np.ascontiguousarray(x, dtype=np.float32).reshape(-1, x.shape[-1])  # q/k norms come as [T, H, D]
        return self.k.rms_norm(x2, self._vector(w), eps).reshape(x.shape)

    def rope(self, x, positions, inv_freq):
        if "rope" not in self.use:
            return super().rope(x, positions, inv_freq)
        # The kernel takes a base and per-frequency divisors; base 1 makes the divisors 1 / inv_freq.
        out = np.ascontiguousarray(x, dtype=np.float32).copy()
        return self.k.rope(out, np.asarray(positions, dtype=np.int32), rot_dim=2 * len(inv_freq), theta_base=1.0,
                           freq_factors=(1.0 / inv_freq).astype(np.float32))

    def gated(self, gate, up, activation):
        if "gated" not in self.use:
            return super().gated(gate, up, activation)
        return self.k.gated_act(np.ascontiguousarray(gate, dtype=np.float32),
                                np.ascontiguousarray(up, dtype=np.float32), activation)

    def attention(self, q, k, v, q_pos, k_pos, window, scale, mask=None):
        if "attention" not in self.use:
            return super().attention(q, k, v, q_pos, k_pos, window, scale, mask)
        n_kv, S, D = k.shape
        kc, vc, slot_pos = self.k.new_kv_cache(n_kv, S, D, "f16")
        self.k.kv_write(kc, vc, slot_pos, np.ascontiguousarray(k.transpose(1, 0, 2), dtype=np.float32),
                        np.ascontiguousarray(v.transpose(1, 0, 2), dtype=np.float32), np.arange(S, dtype=np.int32),
                        np.asarray(k_pos, dtype=np.int32))
        return self.k.attention(np.ascontiguousarray(q, dtype=np.float32), kc, vc, slot_pos,
                                np.asarray(q_pos, dtype=np.int32), scale=scale, window=window, mask=mask)
