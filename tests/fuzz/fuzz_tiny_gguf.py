"""A tiny Llama-family GGUF with random weights and SmolLM2's real tokenizer: small enough that a
fuzz case costs little more than starting the interpreter, with tensors in most formats a GGUF
carries (f32, f16, bf16, q8_0, q4_0, q4_1, q5_0) so mutations reach each reader."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from edgeflash.kernels import quantize
from edgeflash.kernels.formats import FORMATS
from gguf_image import FLOAT32, KV, STRING, UINT32, GGUFImage, write_gguf

D_MODEL, D_FF, N_LAYERS, N_HEADS, N_KV_HEADS = 64, 128, 2, 4, 2
HEAD_DIM = D_MODEL // N_HEADS

# (tensor, rows, cols, format per layer) in numpy order [rows, cols]
_LAYER_TENSORS = [
    ("attn_norm.weight", None, D_MODEL, ("f32", "f16")),
    ("attn_q.weight", N_HEADS * HEAD_DIM, D_MODEL, ("q4_0", "q8_0")),
    ("attn_k.weight", N_KV_HEADS * HEAD_DIM, D_MODEL, ("q4_1", "q5_0")),
    ("attn_v.weight", N_KV_HEADS * HEAD_DIM, D_MODEL, ("q5_0", "q4_1")),
    ("attn_output.weight", D_MODEL, N_HEADS * HEAD_DIM, ("q8_0", "f16")),
    ("ffn_norm.weight", None, D_MODEL, ("f32", "f32")),
    ("ffn_gate.weight", D_FF, D_MODEL, ("q4_0", "q4_1")),
    ("ffn_up.weight", D_FF, D_MODEL, ("q4_1", "q4_0")),
    ("ffn_down.weight", D_MODEL, D_FF, ("q8_0", "q5_0")),
]


def _encode(values: np.ndarray, fmt: str) -> bytes:
    if fmt == "bf16":  # the upper half of each float32 (values here are exact in bf16's range)
        return (values.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16).tobytes()
    return quantize(values.astype(np.float32), fmt).tobytes()


def build_tiny_gguf(tokenizer_source: Path, out: Path, seed: int = 0) -> Path:
    """Write the tiny model to `out`, with the tokenizer metadata of `tokenizer_source` (SmolLM2)."""
    base = GGUFImage.read(tokenizer_source)
    vocab = base.kv("llama.vocab_size").value()
    rng = np.random.default_rng(seed)
    kvs = [
        KV.make("general.architecture", STRING, "llama"),
        KV.make("general.name", STRING, "fuzz-tiny"),
        KV.make("general.type", STRING, "model"),
        KV.make("general.license", STRING, "apache-2.0"),
        KV.make("general.quantization_version", UINT32, 2),
        KV.make("llama.block_count", UINT32, N_LAYERS),
        KV.make("llama.context_length", UINT32, 256),
        KV.make("llama.embedding_length", UINT32, D_MODEL),
        KV.make("llama.feed_forward_length", UINT32, D_FF),
        KV.make("llama.attention.head_count", UINT32, N_HEADS),
        KV.make("llama.attention.head_count_kv", UINT32, N_KV_HEADS),
        KV.make("llama.rope.freq_base", FLOAT32, 10000.0),
        KV.make("llama.attention.layer_norm_rms_epsilon", FLOAT32, 1e-5),
        KV.make("llama.vocab_size", UINT32, vocab),
        KV.make("llama.rope.dimension_count", UINT32, HEAD_DIM),
        *[kv for kv in base.kvs if kv.key.startswith(b"tokenizer.")],
    ]
    tensors = []

    def add(name: str, values: np.ndarray, fmt: str) -> None:
        ggml_dims = list(reversed(values.shape))
        tensors.append((name, ggml_dims, FORMATS[fmt].ggml_type, _encode(values, fmt)))

    add("token_embd.weight", rng.standard_normal((vocab, D_MODEL)) * 0.5, "q8_0")
    add("output_norm.weight", 1 + rng.standard_normal(D_MODEL) * 0.05, "bf16")
    for layer in range(N_LAYERS):
        for name, rows, cols, formats in _LAYER_TENSORS:
            shape = (cols,) if rows is None else (rows, cols)
            values = 1 + rng.standard_normal(shape) * 0.05 if rows is None else rng.standard_normal(shape) * 0.15
            add(f"blk.{layer}.{name}", values, formats[layer])
    return write_gguf(out, kvs, tensors)
