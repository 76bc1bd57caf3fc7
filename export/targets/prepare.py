"""Load and quantize for a target: the bundle's own quantize stage, then the target's form of
each tensor, and the reference model that computes with exactly those values."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from edgeflash.export.progress import note
from edgeflash.export.quant.config import QuantConfig
from edgeflash.export.quant.roles import role_of
from edgeflash.export.quantize import quantize_model
from edgeflash.export.targets.weights import TargetWeight, as_source_tensor, unpack
from edgeflash.runtime.source import ModelSource


@dataclass
class PreparedModel:
    source: ModelSource
    config: QuantConfig
    weights: dict[str, TargetWeight]  # canonical name -> what the target holds

    def reference_source(self) -> ModelSource:
        """The model with every tensor replaced by the float32 values the target computes with:
        the reference runtime on it is the oracle for the target's outputs."""
        tensors = {name: as_source_tensor(w) for name, w in self.weights.items()}
        return ModelSource(path=self.source.path, kind="target-reference", spec=self.source.spec,
                           tokenizer=self.source.tokenizer, tensors=tensors, info=dict(self.source.info))

    def bytes_by_kind(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for w in self.weights.values():
            key = w.kind if w.kind != "dense" else w.dense_format
            out[key] = out.get(key, 0) + w.stored_bytes
        return out


def check_config(source: ModelSource, config: QuantConfig, allowed: tuple[str, ...], target: str) -> None:
    """Refuse before any work a config whose plan gives a tensor a format the target cannot hold."""
    from edgeflash.base.errors import UserError

    for name, t in source.tensors.items():
        plan = config.plan(name, t.shape)
        fmt = t.fmt if plan.format == "keep" else plan.format
        if fmt not in allowed:
            kept = " (kept from the source)" if plan.format == "keep" else ""
            raise UserError(f"target {target}: tensor {name} would be {fmt}{kept}, which {target} cannot hold "
                            f"exactly (it holds {', '.join(allowed)}); choose --quant q4_0, q8_0, f16 or f32, "
                            "or a mixed: scheme of them")


def prepare(source: ModelSource, config: QuantConfig, allowed: tuple[str, ...], target: str,
            importance: dict[str, np.ndarray] | None = None, progress: bool = False,
            adapt: Callable[[TargetWeight], TargetWeight] | None = None) -> PreparedModel:
    """`adapt` turns each unpacked weight into the exact form the target computes with (e.g. the
    scale rounding of its kernels), so the reference model sees the same numbers."""
    check_config(source, config, allowed, target)
    quantized = quantize_model(source, config, importance, progress, desc=f"quantize for {target}")
    weights = {name: unpack(q.tensor, role_of(name), allowed, target) for name, q in quantized.items()}
    if adapt is not None:
        weights = {name: adapt(w) for name, w in weights.items()}
    kinds = sorted({w.kind if w.kind != "dense" else w.dense_format for w in weights.values()})
    note(f"{source.name}: {target} weights as {', '.join(kinds)} (scheme {config.scheme})", progress)
    return PreparedModel(source, config, weights)
