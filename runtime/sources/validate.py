"""What a model file's fields must be before anything is built from them.

`gguf.GGUFFile` checks the file's structure (counts, lengths, offsets, the tensor layout); this
module checks what the fields mean, in three steps of a load:

1. `check_gguf_metadata`: every metadata key the loader reads has the right GGUF type (an
   integer field is an integer, not a float or a bool; a flag is a bool) and a value in range
   (head counts nonzero and dividing, a finite epsilon in (0, 1), a RoPE base > 0, token ids
   inside the vocabulary), and `block_count` is the number of `blk.N` layers the file holds.
   Sizes are bounded here, before a spec or any buffer is sized from them.
2. `check_spec_against_file`: what only the spec knows (head size, value heads, vocabulary).
3. `check_tensor_shapes`: each tensor's shape against the shape the hyperparameters imply.

A failure is a ModelFormatError naming the file, the field, its value and what was expected.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np
from edgeflash.base.errors import ModelFormatError
from edgeflash.base.printable import printable, quoted
from edgeflash.runtime.sources.gguf_types import (
    ARRAY_TYPE,
    BLOCK_PREFIX,
    BOOL_TYPE,
    FLOAT_TYPES,
    INTEGER_TYPES,
    STRING_TYPE,
    type_name,
)

if TYPE_CHECKING:
    from edgeflash.runtime.sources.gguf import GGUFFile
    from edgeflash.runtime.spec import ModelSpec

MAX_LAYERS = 1 << 16
MAX_VOCAB = 1 << 24
# {arch}.<field>: (smallest, largest) integer value.
ARCH_INTEGER_FIELDS = {
    "block_count": (1, MAX_LAYERS),
    "embedding_length": (1, 1 << 20),
    "feed_forward_length": (1, 1 << 22),
    "attention.head_count": (1, 1 << 12),
    "attention.head_count_kv": (1, 1 << 12),
    "attention.key_length": (1, 1 << 16),
    "attention.value_length": (1, 1 << 16),
    "attention.sliding_window": (0, (1 << 31) - 1),
    "context_length": (1, (1 << 31) - 1),
    "rope.dimension_count": (0, 1 << 16),
    "vocab_size": (1, MAX_VOCAB),
}
# {arch}.<field>: (what it must be, test).
ARCH_FLOAT_FIELDS = {
    "attention.layer_norm_rms_epsilon": ("a finite number in (0, 1)", lambda v: 0 < v < 1),
    "rope.freq_base": ("a finite number > 0", lambda v: v > 0),
    "rope.scaling.factor": ("a finite number > 0", lambda v: v > 0),
}
ARCH_STRING_FIELDS = ("rope.scaling.type",)
# Token types of tokenizer.ggml.token_type (llama.cpp's: undefined, normal, unknown, control,
# user-defined, unused, byte).
TOKEN_TYPES = range(7)
TOKEN_ID_FIELDS = ("bos_token_id", "eos_token_id", "unknown_token_id", "padding_token_id", "eot_token_id",
                   "eom_token_id", "sep_token_id", "cls_token_id", "mask_token_id")
BOOL_FIELDS = ("tokenizer.ggml.add_bos_token", "tokenizer.ggml.add_eos_token", "tokenizer.ggml.add_space_prefix",
               "tokenizer.ggml.add_sep_token")
STRING_FIELDS = ("general.name", "tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.chat_template")


def _fail(where: str, key: str, value: Any, vtype: int | None, expected: str) -> ModelFormatError:
    kind = f" ({type_name(vtype)})" if vtype is not None else ""
    return ModelFormatError(f"{where}: {key} = {printable(repr(value), 80)}{kind}: expected {expected}")


def check_gguf_metadata(f: GGUFFile, where: str) -> None:
    """Types and ranges of every metadata field the loader reads (step 1)."""
    meta, types = f.metadata, f.value_types
    prefix = f.architecture + "."
    for field, (low, high) in ARCH_INTEGER_FIELDS.items():
        key = prefix + field
        if key in meta and types[key] != ARRAY_TYPE:  # per-layer arrays: the family says whether it runs them
            _check_integer(meta[key], types[key], key, low, high, where)
    for field, (expected, ok) in ARCH_FLOAT_FIELDS.items():
        key = prefix + field
        if key in meta:
            value, vtype = meta[key], types[key]
            if (vtype not in INTEGER_TYPES and vtype not in FLOAT_TYPES) or not math.isfinite(value) or not ok(value):
                raise _fail(where, key, value, vtype, expected)
    for field in ARCH_STRING_FIELDS:
        _check_string(meta, types, prefix + field, where)
    if meta.get(prefix + "rope.scaling.type") == "linear" and prefix + "rope.scaling.factor" not in meta:
        raise ModelFormatError(f"{where}: {prefix}rope.scaling.type is 'linear' but {prefix}rope.scaling.factor "
                               "is missing")
    heads, kv_heads = meta.get(prefix + "attention.head_count"), meta.get(prefix + "attention.head_count_kv")
    if isinstance(heads, int) and isinstance(kv_heads, int) and heads % kv_heads:
        raise _fail(where, prefix + "attention.head_count_kv", kv_heads, None,
                    f"a divisor of {prefix}attention.head_count ({heads})")
    layers, present = meta.get(prefix + "block_count"), f.block_count_of_tensors()
    if isinstance(layers, int) and layers != present:
        raise _fail(where, prefix + "block_count", layers, None,
                    f"{present}, the number of layers (blk.0 .. blk.{present - 1}) the file holds tensors for"
                    if present else "layers the file holds tensors for (it has no blk.N tensors)")
    for name in f.tensors:
        if name.startswith("blk.") and not BLOCK_PREFIX.match(name):
            raise ModelFormatError(f"{where}: tensor {quoted(name)} is not named blk.N.<tensor> with N a layer number")
    for key in STRING_FIELDS:
        _check_string(meta, types, key, where)
    for key in BOOL_FIELDS:
        if key in meta and types[key] != BOOL_TYPE:
            raise _fail(where, key, meta[key], types[key], "true or false (bool)")
    _check_tokenizer(f, where)


def _check_integer(value: Any, vtype: int, key: str, low: int, high: int, where: str) -> None:
    if vtype not in INTEGER_TYPES:
        raise _fail(where, key, value, vtype, f"an integer in {low}..{high}")
    if not low <= value <= high:
        raise _fail(where, key, value, None, f"an integer in {low}..{high}")


def _check_string(meta: dict[str, Any], types: dict[str, int], key: str, where: str) -> None:
    if key in meta and types[key] != STRING_TYPE:
        raise _fail(where, key, meta[key], types[key], "a string")


def _check_array(f: GGUFFile, key: str, element_types: frozenset[int] | tuple[int, ...], what: str,
                 where: str) -> list[Any] | None:
    if key not in f.metadata:
        return None
    vtype, etype = f.value_types[key], f.array_types.get(key)
    if vtype != ARRAY_TYPE or etype not in element_types:
        shown = type_name(vtype) if vtype != ARRAY_TYPE else f"array of {type_name(etype)}"
        raise ModelFormatError(f"{where}: {key} is {shown}; expected {what}")
    return f.metadata[key]


def _check_tokenizer(f: GGUFFile, where: str) -> None:
    tokens = _check_array(f, "tokenizer.ggml.tokens", (STRING_TYPE,), "an array of strings", where)
    if tokens is None:
        raise ModelFormatError(f"{where}: metadata key tokenizer.ggml.tokens is missing (the vocabulary)")
    if not 1 <= len(tokens) <= MAX_VOCAB:
        raise ModelFormatError(f"{where}: tokenizer.ggml.tokens has {len(tokens)} tokens; expected 1..{MAX_VOCAB}")
    n = len(tokens)
    scores = _check_array(f, "tokenizer.ggml.scores", FLOAT_TYPES | INTEGER_TYPES, "an array of numbers", where)
    if scores is not None:
        if len(scores) != n:
            raise ModelFormatError(f"{where}: tokenizer.ggml.scores has {len(scores)} entries; expected {n} (one per "
                                   "token)")
        values = np.asarray(scores, dtype=np.float64)
        if not np.isfinite(values).all():
            index = int(np.flatnonzero(~np.isfinite(values))[0])
            raise _fail(where, f"tokenizer.ggml.scores[{index}]", scores[index], None, "a finite number")
    types = _check_array(f, "tokenizer.ggml.token_type", INTEGER_TYPES, "an array of integers", where)
    if types is not None:
        if len(types) != n:
            raise ModelFormatError(f"{where}: tokenizer.ggml.token_type has {len(types)} entries; expected {n} (one "
                                   "per token)")
        values = np.asarray(types, dtype=np.int64)
        bad = np.flatnonzero((values < TOKEN_TYPES.start) | (values >= TOKEN_TYPES.stop))
        if len(bad):
            raise _fail(where, f"tokenizer.ggml.token_type[{int(bad[0])}]", types[int(bad[0])], None,
                        f"a token type in {TOKEN_TYPES.start}..{TOKEN_TYPES.stop - 1}")
    _check_array(f, "tokenizer.ggml.merges", (STRING_TYPE,), "an array of strings", where)
    for field in TOKEN_ID_FIELDS:
        key = "tokenizer.ggml." + field
        if key in f.metadata:
            _check_integer(f.metadata[key], f.value_types[key], key, 0, n - 1, where)


def check_spec_against_file(spec: ModelSpec, f: GGUFFile, where: str) -> None:
    """What needs the spec: the head size the engine and RoPE can run, value heads as wide as key
    heads, a vocabulary the embedding covers (step 2)."""
    prefix = f.architecture + "."
    if spec.head_dim % 2:
        raise _fail(where, prefix + "attention.key_length (the head size)", spec.head_dim, None,
                    "an even number (RoPE rotates pairs of values)")
    value_length = f.metadata.get(prefix + "attention.value_length")
    if value_length is not None and value_length != spec.head_dim:
        raise _fail(where, prefix + "attention.value_length", value_length, None,
                    f"the key head size {spec.head_dim} (this engine's value heads are as wide as its key heads)")
    tokens = len(f.metadata["tokenizer.ggml.tokens"])
    if tokens > spec.vocab_size:
        raise _fail(where, prefix + "vocab_size", spec.vocab_size, None,
                    f"at least the {tokens} tokens of tokenizer.ggml.tokens")
    check_rope(spec, where)


def check_rope(spec: ModelSpec, where: str) -> None:
    """The RoPE frequencies the spec implies (base, scaling, per layer kind) as the engine takes
    them: finite and nonzero in float32 (a scaling factor of 1e-300 or a base of 1e300 is not)."""
    from edgeflash.base.errors import UnsupportedModelError
    from edgeflash.runtime.rope import inv_frequencies

    seen = set()
    for layer, kind in enumerate(spec.layer_kinds):
        if kind in seen:
            continue
        seen.add(kind)
        try:
            with np.errstate(all="ignore"):
                inv = inv_frequencies(spec, layer)
        except UnsupportedModelError:
            raise
        except (KeyError, TypeError, ValueError, ZeroDivisionError, OverflowError) as e:
            raise ModelFormatError(f"{where}: RoPE scaling {printable(repr(spec.rope_scaling), 120)} cannot be "
                                   f"used ({printable(e)})") from None
        with np.errstate(all="ignore"):
            inv32 = np.asarray(inv, dtype=np.float64).astype(np.float32)
        if inv32.shape != (spec.rope_dim // 2,) or not np.all(np.isfinite(inv32)) or not np.all(inv32 > 0):
            raise ModelFormatError(
                f"{where}: RoPE base {spec.rope_base(layer)} with scaling {printable(repr(spec.rope_scaling), 120)} "
                f"gives {kind} layers frequencies that are not finite and positive; expected a usable RoPE base "
                "and scaling factor")


def expected_tensor_shapes(spec: ModelSpec) -> tuple[dict[str, tuple[int, ...]], dict[str, tuple[int, ...]]]:
    """(shapes of the model-wide tensors, shapes of each layer's tensors without the `blk.N.`
    prefix), in numpy order [rows, cols], for every tensor the families read."""
    d, q, kv, ff, head, vocab = spec.d_model, spec.q_dim, spec.kv_dim, spec.d_ff, spec.head_dim, spec.vocab_size
    model = {"token_embd.weight": (vocab, d), "output.weight": (vocab, d), "output_norm.weight": (d,)}
    layer = {
        "attn_norm.weight": (d,), "ffn_norm.weight": (d,), "post_attention_norm.weight": (d,),
        "post_ffw_norm.weight": (d,),
        "attn_q.weight": (q, d), "attn_k.weight": (kv, d), "attn_v.weight": (kv, d), "attn_output.weight": (d, q),
        "attn_q.bias": (q,), "attn_k.bias": (kv,), "attn_v.bias": (kv,),
        "attn_q_norm.weight": (head,), "attn_k_norm.weight": (head,),
        "ffn_gate.weight": (ff, d), "ffn_up.weight": (ff, d), "ffn_down.weight": (d, ff),
    }
    return model, layer


def check_tensor_shapes(spec: ModelSpec, shapes: dict[str, tuple[int, ...]], where: str) -> None:
    """Each tensor's shape against the hyperparameters (step 3): names the tensor, its shape and the
    shape the spec implies."""
    model, layer = expected_tensor_shapes(spec)
    for name, shape in shapes.items():
        expected = model.get(name)
        if expected is None and name.startswith("blk."):
            expected = layer.get(name.split(".", 2)[2] if name.count(".") >= 2 else "")
        if expected is not None and tuple(shape) != expected:
            raise ModelFormatError(
                f"{where}: tensor {quoted(name)} has shape {list(shape)}; the metadata implies {list(expected)} "
                f"(hidden size {spec.d_model}, FFN length {spec.d_ff}, {spec.n_heads} heads and {spec.n_kv_heads} "
                f"KV heads of {spec.head_dim}, vocabulary {spec.vocab_size})")


# config.json (or its text_config): key -> (smallest, largest) integer value.
HF_INTEGER_FIELDS = {
    "hidden_size": (1, 1 << 20), "intermediate_size": (1, 1 << 22), "num_attention_heads": (1, 1 << 12),
    "num_key_value_heads": (1, 1 << 12), "num_hidden_layers": (1, MAX_LAYERS), "vocab_size": (1, MAX_VOCAB),
    "head_dim": (1, 1 << 16), "max_position_embeddings": (1, (1 << 31) - 1), "sliding_window": (0, (1 << 31) - 1),
    "sliding_window_pattern": (1, MAX_LAYERS), "query_pre_attn_scalar": (1, 1 << 20),
}
HF_FLOAT_FIELDS = {"rms_norm_eps": ("a finite number in (0, 1)", lambda v: 0 < v < 1),
                   "rope_theta": ("a finite number > 0", lambda v: v > 0),
                   "rope_local_base_freq": ("a finite number > 0", lambda v: v > 0),
                   "partial_rotary_factor": ("a finite number in (0, 1]", lambda v: 0 < v <= 1),
                   "final_logit_softcapping": ("a finite number >= 0", lambda v: v >= 0)}


def check_hf_config(config: dict[str, Any], where: str) -> None:
    """Types and ranges of the config.json fields the families read (null counts as absent)."""
    if config.get("model_type") == "gemma3" and isinstance(config.get("text_config"), dict):
        config = config["text_config"]
    for key, (low, high) in HF_INTEGER_FIELDS.items():
        value = config.get(key)
        if value is not None and (type(value) is not int or not low <= value <= high):
            raise _fail(where, key, value, None, f"an integer in {low}..{high}")
    for key, (expected, ok) in HF_FLOAT_FIELDS.items():
        value = config.get(key)
        if value is not None and (type(value) not in (int, float) or not math.isfinite(value) or not ok(value)):
            raise _fail(where, key, value, None, expected)
    heads, kv_heads = config.get("num_attention_heads"), config.get("num_key_value_heads")
    if heads and kv_heads and heads % kv_heads:
        raise _fail(where, "num_key_value_heads", kv_heads, None, f"a divisor of num_attention_heads ({heads})")
    layer_types = config.get("layer_types")
    if layer_types is not None and (not isinstance(layer_types, list) or len(layer_types) != config.get(
            "num_hidden_layers") or not all(isinstance(t, str) for t in layer_types)):
        raise _fail(where, "layer_types", layer_types, None, "one string per layer (num_hidden_layers of them)")
    for key in ("rope_parameters", "rope_scaling"):
        if config.get(key) is not None and not isinstance(config[key], dict):
            raise _fail(where, key, config[key], None, "an object")
    for key in ("hidden_act", "hidden_activation", "model_type"):
        if config.get(key) is not None and not isinstance(config[key], str):
            raise _fail(where, key, config[key], None, "a string")
