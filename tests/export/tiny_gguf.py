"""A small llama-architecture GGUF with random q8_0 weights (ffn_gate and ffn_up in `ffn_format`, e.g.
q4_k as in a Q4_K_M file) and SmolLM2's real tokenizer.

Shaped to make memory measurable: many layers of moderate width, so the whole model in float32
is several hundred MB while one layer is a few tens. Written with the `gguf` package's writer.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np


def write_tiny_gguf(out: Path, tokenizer_from: Path, *, layers: int = 24, hidden: int = 512, ffn: int = 2048,
                    heads: int = 8, kv_heads: int = 4, seed: int = 0, ffn_format: str = "q8_0") -> Path:
    from edgeflash.export.quant import quantize_matrix
    from edgeflash.kernels.formats import get_format
    from edgeflash.runtime.sources.gguf import GGUFFile
    from gguf import GGMLQuantizationType, GGUFWriter

    donor = GGUFFile(tokenizer_from).metadata
    vocab = len(donor["tokenizer.ggml.tokens"])
    w = GGUFWriter(str(out), "llama")
    w.add_name("tiny-random-llama")
    w.add_block_count(layers)
    w.add_context_length(2048)
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(ffn)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(vocab)
    w.add_rope_dimension_count(hidden // heads)
    w.add_tokenizer_model(donor["tokenizer.ggml.model"])
    w.add_tokenizer_pre(donor["tokenizer.ggml.pre"])
    w.add_token_list(donor["tokenizer.ggml.tokens"])
    w.add_token_types(donor["tokenizer.ggml.token_type"])
    w.add_token_merges(donor["tokenizer.ggml.merges"])
    w.add_bos_token_id(donor["tokenizer.ggml.bos_token_id"])
    w.add_eos_token_id(donor["tokenizer.ggml.eos_token_id"])
    w.add_add_bos_token(False)
    rng = np.random.default_rng(seed)
    kv = hidden // heads * kv_heads

    def matrix(name: str, rows: int, cols: int, fmt: str = "q8_0") -> None:
        values = (rng.standard_normal((rows, cols)) / np.sqrt(cols)).astype(np.float32)
        w.add_tensor(name, quantize_matrix(values, fmt, "rtn"), raw_shape=(rows, get_format(fmt).row_bytes(cols)),
                     raw_dtype=GGMLQuantizationType[fmt.upper()])

    def vector(name: str, n: int) -> None:
        w.add_tensor(name, (1.0 + 0.05 * rng.standard_normal(n)).astype(np.float32))

    matrix("token_embd.weight", vocab, hidden)
    for i in range(layers):
        vector(f"blk.{i}.attn_norm.weight", hidden)
        for name, rows, cols in (("attn_q", hidden, hidden), ("attn_k", kv, hidden), ("attn_v", kv, hidden),
                                 ("attn_output", hidden, hidden)):
            matrix(f"blk.{i}.{name}.weight", rows, cols)
        vector(f"blk.{i}.ffn_norm.weight", hidden)
        for name, rows, cols in (("ffn_gate", ffn, hidden), ("ffn_up", ffn, hidden), ("ffn_down", hidden, ffn)):
            matrix(f"blk.{i}.{name}.weight", rows, cols, ffn_format if name != "ffn_down" else "q8_0")
    vector("output_norm.weight", hidden)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out
