"""What a bundle manifest's model spec and calibration must hold before anything is built from them.

`manifest.parse_manifest` checks where bytes are (blocks, tensors, arenas); this module checks
what the numbers mean: every `model.spec` field has its type and a range a real model has (the
same bounds as a GGUF file's fields), the tensor table's shapes and the arenas agree with the spec,
and every calibration array the runtime reads (sparsity thresholds, predictor thresholds, token
counts) has one finite entry per layer or level and ids inside the vocabulary. A failure is a
ModelFormatError naming the manifest, the field, its value and what was expected.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
from edgeflash.base.errors import ModelFormatError, UnsupportedModelError
from edgeflash.base.printable import printable
from edgeflash.runtime.bundle.packed import is_packed, unpack_array
from edgeflash.runtime.sources.validate import (
    ARCH_INTEGER_FIELDS,
    MAX_LAYERS,
    MAX_VOCAB,
    check_rope,
    check_tensor_shapes,
)
from edgeflash.runtime.spec import ACTIVATIONS, LAYER_KINDS, ModelSpec

FAMILIES = ("llama", "gemma3")
_INT32 = (1 << 31) - 1
# model.spec integer fields: (smallest, largest), the GGUF bounds of the same hyperparameters.
SPEC_INTEGERS = {
    "n_layers": (1, MAX_LAYERS),
    "d_model": ARCH_INTEGER_FIELDS["embedding_length"],
    "n_heads": ARCH_INTEGER_FIELDS["attention.head_count"],
    "n_kv_heads": ARCH_INTEGER_FIELDS["attention.head_count_kv"],
    "head_dim": ARCH_INTEGER_FIELDS["attention.key_length"],
    "d_ff": ARCH_INTEGER_FIELDS["feed_forward_length"],
    "vocab_size": (1, MAX_VOCAB),
    "context_length": (1, _INT32),
    "rope_dim": (0, 1 << 16),
    "sliding_window": (0, _INT32),
}
# model.spec float fields: (what it must be, test); all finite.
SPEC_FLOATS = {
    "norm_eps": ("a finite number in (0, 1)", lambda v: 0 < v < 1),
    "rope_theta": ("a finite number > 0", lambda v: v > 0),
    "rope_theta_local": ("a finite number >= 0", lambda v: v >= 0),
    "embedding_scale": ("a finite number > 0", lambda v: v > 0),
    "attn_scale": ("a finite number >= 0", lambda v: v >= 0),
    "final_logit_softcap": ("a finite number >= 0", lambda v: v >= 0),
}
SPEC_BOOLS = ("tied_embeddings", "attn_bias", "qk_norm", "sandwich_norm")


def _fail(where: Path, field: str, value: Any, expected: str) -> ModelFormatError:
    return ModelFormatError(f"{where}: {field} = {printable(repr(value), 80)}: expected {expected}")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_spec(raw: Any, where: Path) -> ModelSpec:
    """`model.spec` as a ModelSpec, every field checked first."""
    if not isinstance(raw, dict):
        raise _fail(where, "model.spec", raw, "an object")
    for key, (low, high) in SPEC_INTEGERS.items():
        if key in raw and not (_is_int(raw[key]) and low <= raw[key] <= high):
            raise _fail(where, f"model.spec.{key}", raw[key], f"an integer in [{low}, {high}]")
    for key, (expected, ok) in SPEC_FLOATS.items():
        if key in raw and not (_is_number(raw[key]) and math.isfinite(raw[key]) and ok(raw[key])):
            raise _fail(where, f"model.spec.{key}", raw[key], expected)
    for key in SPEC_BOOLS:
        if key in raw and not isinstance(raw[key], bool):
            raise _fail(where, f"model.spec.{key}", raw[key], "true or false")
    for key, allowed in (("family", FAMILIES), ("activation", ACTIVATIONS)):
        if key in raw and raw[key] not in allowed:
            raise _fail(where, f"model.spec.{key}", raw[key], f"one of {', '.join(allowed)}")
    if "arch" in raw and not isinstance(raw["arch"], str):
        raise _fail(where, "model.spec.arch", raw["arch"], "a string")
    kinds = raw.get("layer_kinds", [])
    if not isinstance(kinds, list) or any(k not in LAYER_KINDS for k in kinds):
        raise _fail(where, "model.spec.layer_kinds", kinds, f"a list of {' / '.join(LAYER_KINDS)}")
    scaling = raw.get("rope_scaling")
    if scaling is not None and not (isinstance(scaling, dict) and len(scaling) <= 16 and all(
            isinstance(k, str) and (isinstance(v, str) or _positive(v) or (
                isinstance(v, list) and len(v) <= 1 << 16 and all(_positive(x) for x in v)))
            for k, v in scaling.items())):
        raise _fail(where, "model.spec.rope_scaling", scaling,
                    "null or an object of names, positive numbers and lists of them")
    try:
        spec = ModelSpec.from_dict(raw)
    except UnsupportedModelError as e:
        raise ModelFormatError(f"{where}: model.spec: {e}") from None
    except (TypeError, ValueError, ZeroDivisionError) as e:
        raise ModelFormatError(f"{where}: model.spec is not a valid model spec ({printable(e)})") from None
    try:
        check_rope(spec, f"{where}: model.spec")
    except UnsupportedModelError as e:
        raise ModelFormatError(f"{where}: model.spec: {e}") from None
    return spec


def _positive(value: Any) -> bool:
    return _is_number(value) and math.isfinite(value) and value > 0


def check_tables_against_spec(spec: ModelSpec, blocks: dict[str, Any], tensors: dict[str, Any], where: Path,
                              whole_tensors: bool = True) -> None:
    """Tensor shapes, layer numbers and arena geometry against the spec. A rank's bundle
    (`whole_tensors=False`) holds a cut of each tensor, whose shapes the shard table gives instead."""
    for block in blocks.values():
        if block.layer is not None and block.layer >= spec.n_layers:
            raise _fail(where, f"block {block.name}: layer", block.layer, f"a layer < n_layers {spec.n_layers}")
        a = block.arena
        if a is not None:
            if a.layer >= spec.n_layers or a.d_model != spec.d_model or a.n_neurons != spec.d_ff:
                raise ModelFormatError(
                    f"{where}: block {block.name}: its arena (layer {a.layer}, {a.n_neurons} neurons of d_model "
                    f"{a.d_model}) does not match the spec ({spec.n_layers} layers, d_ff {spec.d_ff}, d_model "
                    f"{spec.d_model})")
    for name, t in tensors.items():
        if name.startswith("blk."):
            index = name.split(".")[1]
            if not index.isdigit() or int(index) >= spec.n_layers:
                raise ModelFormatError(f"{where}: tensor {printable(name)} names a layer outside 0..{spec.n_layers - 1}")
    if whole_tensors:
        check_tensor_shapes(spec, {name: t.shape for name, t in tensors.items()}, str(where))
    for layer in range(spec.n_layers):
        a, b = tensors.get(f"blk.{layer}.predictor_a.weight"), tensors.get(f"blk.{layer}.predictor_b.weight")
        if (a is None) != (b is None):
            raise ModelFormatError(f"{where}: layer {layer} has only one of predictor_a and predictor_b")
        if a is not None and (len(a.shape) != 2 or len(b.shape) != 2 or a.shape[1] != spec.d_model
                              or b.shape != (spec.d_ff, a.shape[0])):
            raise ModelFormatError(f"{where}: layer {layer}'s predictor shapes {list(a.shape)} and {list(b.shape)} do "
                                   f"not fit d_model {spec.d_model} and d_ff {spec.d_ff}")


def _array(value: Any, field: str, where: Path) -> np.ndarray:
    try:
        a = unpack_array(value, field)
    except ValueError as e:
        raise ModelFormatError(f"{where}: {e}") from None
    if a.dtype == object or (a.size and not np.issubdtype(a.dtype, np.number)) or a.dtype == np.bool_:
        raise _fail(where, field, value, "an array of numbers")
    return a


def _per_layer(value: Any, field: str, where: Path, n_layers: int, width: int | None) -> list[np.ndarray]:
    """A list of one numeric array per layer (each packed or a list), `width` values each (when given)."""
    if is_packed(value):
        rows = list(_array(value, field, where))
    elif isinstance(value, list):
        rows = [_array(row, f"{field}[{i}]", where) for i, row in enumerate(value)]
    else:
        raise _fail(where, field, value, f"one array per layer ({n_layers})")
    if len(rows) != n_layers:
        raise ModelFormatError(f"{where}: {field} has {len(rows)} entries; expected one per layer ({n_layers})")
    for i, row in enumerate(rows):
        if row.ndim != 1 or (width is not None and len(row) != width) or not np.all(np.isfinite(row)):
            raise ModelFormatError(f"{where}: {field}[{i}] must be {width if width is not None else 'a list of'} "
                                   "finite numbers")
    return rows


def check_calibration(raw: Any, spec: ModelSpec, where: Path) -> None:
    """Every calibration array a run reads: one finite entry per layer and level, ids in the vocabulary."""
    if raw is None:
        return
    if not isinstance(raw, dict):
        raise _fail(where, "calibration", raw, "an object")
    n = spec.n_layers
    for key in ("text", "sparsity", "neurons", "predictors", "token_frequencies"):
        if key in raw and raw[key] is not None and not isinstance(raw[key], dict):
            raise _fail(where, f"calibration.{key}", raw[key], "an object")
    sparsity = raw.get("sparsity") or {}
    targets = sparsity.get("targets", [])
    if not isinstance(targets, list) or not all(_is_number(t) and 0 <= t < 1 for t in targets):
        raise _fail(where, "calibration.sparsity.targets", targets, "a list of fractions in [0, 1)")
    for key in ("act_threshold", "gate_threshold"):
        if key in sparsity:
            rows = _per_layer(sparsity[key], f"calibration.sparsity.{key}", where, n, len(targets))
            if any(np.any(r < 0) for r in rows):
                raise ModelFormatError(f"{where}: calibration.sparsity.{key} holds a negative threshold")
    neurons = raw.get("neurons") or {}
    for key in ("frequency", "order"):
        if key in neurons:
            _per_layer(neurons[key], f"calibration.neurons.{key}", where, n, spec.d_ff)
    predictors = raw.get("predictors")
    if predictors:
        rank = predictors.get("rank")
        if not (_is_int(rank) and 0 < rank <= spec.d_model):
            raise _fail(where, "calibration.predictors.rank", rank, f"an integer in [1, {spec.d_model}]")
        for key in ("threshold", "recall", "precision", "predicted_active"):
            if key in predictors:
                values = _array(predictors[key], f"calibration.predictors.{key}", where)
                if values.shape != (n,) or not np.all(np.isfinite(values)):
                    raise ModelFormatError(f"{where}: calibration.predictors.{key} must be {n} finite numbers")
                if key != "threshold" and np.any((values < 0) | (values > 1)):
                    raise ModelFormatError(f"{where}: calibration.predictors.{key} must be fractions in [0, 1]")
        if "sparsity" in predictors and not (_is_number(predictors["sparsity"]) and 0 <= predictors["sparsity"] < 1):
            raise _fail(where, "calibration.predictors.sparsity", predictors["sparsity"], "a fraction in [0, 1)")
    tf = raw.get("token_frequencies") or {}
    if "ids" in tf:
        ids = _array(tf["ids"], "calibration.token_frequencies.ids", where)
        if ids.ndim != 1 or (ids.size and (not np.issubdtype(ids.dtype, np.integer) or ids.min() < 0
                                           or ids.max() >= spec.vocab_size)):
            raise ModelFormatError(f"{where}: calibration.token_frequencies.ids must be token ids in "
                                   f"[0, {spec.vocab_size})")
        if "counts" in tf:
            counts = _array(tf["counts"], "calibration.token_frequencies.counts", where)
            if counts.shape != ids.shape or (counts.size and np.any(counts < 0)):
                raise ModelFormatError(f"{where}: calibration.token_frequencies.counts must be one count >= 0 per id")
