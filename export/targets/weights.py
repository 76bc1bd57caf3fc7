"""What a target holds for each tensor: dense floats, or int4/int8 codes with per-group scales.

The project's own quantize stage (`quantize_model` with the same QuantConfig as a bundle) makes
GGML-layout tensors; this module unpacks the layouts a target can hold exactly:

- q4_0 -> int4 codes in [-8, 7], one scale per 32 values (symmetric, no offset);
- q8_0 -> int8 codes in [-127, 127], one scale per 32 values;
- f32 / f16 / bf16 -> dense values (f16 and bf16 keep their rounding);

Every other format (q4_1, q5_0, q4_k, ...) has no exact counterpart in the targets' own
quantization, so it is refused with one line naming the tensor and the formats that work.
`values()` gives the float32 matrix the target multiplies with: the reference runtime runs on
exactly these numbers for the parity checks.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from edgeflash.base.errors import UserError
from edgeflash.kernels.formats import FORMATS
from edgeflash.runtime.tensors import Tensor

GROUP = FORMATS["q4_0"].block_elems  # values per scale of q4_0 / q8_0 (both 32)


@dataclass
class TargetWeight:
    name: str
    role: str
    kind: str  # "dense" | "int4" | "int8"
    shape: tuple[int, ...]
    dense: np.ndarray | None = None  # float32 in `shape` (kind "dense")
    dense_format: str = "f32"  # the rounding the dense values carry: f32, f16 or bf16
    codes: np.ndarray | None = None  # int8 [rows, cols]: int4/int8 codes
    scales: np.ndarray | None = None  # float32 [rows, cols // GROUP]

    @property
    def bits(self) -> int:
        return {"int4": 4, "int8": 8}.get(self.kind, 32)

    def values(self) -> np.ndarray:
        """float32 values the target computes with, in `shape`."""
        if self.kind == "dense":
            return self.dense
        rows, cols = self.codes.shape
        grouped = self.codes.reshape(rows, cols // GROUP, GROUP).astype(np.float32)  # [rows, groups, 32]
        return (grouped * self.scales[:, :, None]).reshape(self.shape)

    @property
    def stored_bytes(self) -> int:
        """Bytes of the packed form (codes at their bit width plus float16 scales)."""
        if self.kind == "dense":
            return int(np.prod(self.shape)) * (2 if self.dense_format in ("f16", "bf16") else 4)
        return self.codes.size * self.bits // 8 + self.scales.size * 2


def unpack(t: Tensor, role: str, allowed: tuple[str, ...], target: str) -> TargetWeight:
    """The target form of a quantized (or source) tensor in GGML layout."""
    fmt = t.fmt
    if fmt not in allowed:
        raise UserError(f"target {target}: tensor {t.name} would be {fmt}, which {target} cannot hold "
                        f"exactly (it holds {', '.join(allowed)}); choose --quant q4_0, q8_0, f16 or f32, "
                        "or a mixed: scheme of them")
    if fmt in ("f32", "f16", "bf16"):
        return TargetWeight(t.name, role, "dense", t.shape, dense=t.dequantize(), dense_format=fmt)
    raw = np.ascontiguousarray(t.raw).reshape(t.rows, -1)
    if fmt == "q4_0":
        codes, scales = _unpack_q4_0(raw, t.cols)
        return TargetWeight(t.name, role, "int4", t.shape, codes=codes, scales=scales)
    if fmt == "q8_0":
        codes, scales = _unpack_q8_0(raw, t.cols)
        return TargetWeight(t.name, role, "int8", t.shape, codes=codes, scales=scales)
    raise UserError(f"target {target}: no unpacking for format {fmt} of tensor {t.name}")


def _unpack_q4_0(raw: np.ndarray, cols: int) -> tuple[np.ndarray, np.ndarray]:
    # Block of 18 bytes: f16 scale, then 16 bytes holding element j in the low nibble of byte j
    # and element j + 16 in its high nibble; value = (nibble - 8) * scale.
    rows = raw.shape[0]
    blocks = raw.reshape(rows, cols // GROUP, FORMATS["q4_0"].block_bytes)
    scales = blocks[:, :, :2].copy().view(np.float16)[:, :, 0].astype(np.float32)  # [rows, groups]
    qs = blocks[:, :, 2:]  # [rows, groups, 16]
    nibbles = np.concatenate([qs & 0x0F, qs >> 4], axis=2)  # [rows, groups, 32]
    codes = (nibbles.astype(np.int8) - 8).reshape(rows, cols)
    return codes, scales


def _unpack_q8_0(raw: np.ndarray, cols: int) -> tuple[np.ndarray, np.ndarray]:
    # Block of 34 bytes: f16 scale, then 32 int8 codes.
    rows = raw.shape[0]
    blocks = raw.reshape(rows, cols // GROUP, FORMATS["q8_0"].block_bytes)
    scales = blocks[:, :, :2].copy().view(np.float16)[:, :, 0].astype(np.float32)
    codes = blocks[:, :, 2:].copy().view(np.int8).reshape(rows, cols)
    return codes, scales


def as_source_tensor(w: TargetWeight) -> Tensor:
    """An f32 Tensor of the values the target computes with (for the reference runtime)."""
    return Tensor.from_array(w.name, w.values(), "f32")
