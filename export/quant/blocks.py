"""Bit packing of the GGML 32-value block formats from per-block scales and integer levels.

Each packer takes `[n_blocks, 32]` integer levels and per-block fp16 parameters and returns
`[n_blocks, block_bytes]` uint8 in ggml's layout (so GGUF readers and our kernels decode it):
- q4_0: fp16 d, 16 bytes; byte j = q[j] | q[j + 16] << 4, q = level + 8, value = d * level
- q5_0: fp16 d, uint32 high bits (bit j = bit 4 of q[j]), 16 low-nibble bytes; q = level + 16
- q4_1: fp16 d, fp16 m, 16 nibble bytes; value = d * q + m
- q8_0: fp16 d, 32 int8 levels
"""

from __future__ import annotations

import numpy as np


def _fp16_bytes(values: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(values, dtype=np.float16).reshape(-1, 1).view(np.uint8)  # [n, 2]


def _nibbles(q: np.ndarray) -> np.ndarray:
    q = q.astype(np.uint8)
    return (q[:, :16] & 0x0F) | ((q[:, 16:] & 0x0F) << 4)  # [n, 16]


def pack_q4_0(d: np.ndarray, levels: np.ndarray) -> np.ndarray:
    return np.concatenate([_fp16_bytes(d), _nibbles(levels + 8)], axis=1)


def pack_q5_0(d: np.ndarray, levels: np.ndarray) -> np.ndarray:
    q = (levels + 16).astype(np.uint32)  # [n, 32] in 0..31
    high = ((q >> 4) & 1) << np.arange(32, dtype=np.uint32)  # bit j of qh = bit 4 of q[j]
    qh = np.bitwise_or.reduce(high, axis=1).astype("<u4").reshape(-1, 1).view(np.uint8)  # [n, 4]
    return np.concatenate([_fp16_bytes(d), qh, _nibbles(q)], axis=1)


def pack_q4_1(d: np.ndarray, m: np.ndarray, q: np.ndarray) -> np.ndarray:
    return np.concatenate([_fp16_bytes(d), _fp16_bytes(m), _nibbles(q)], axis=1)


def pack_q8_0(d: np.ndarray, levels: np.ndarray) -> np.ndarray:
    return np.concatenate([_fp16_bytes(d), levels.astype(np.int8).view(np.uint8)], axis=1)
