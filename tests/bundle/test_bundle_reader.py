"""Reading a bundle: layout rules, zero-copy tensors, positioned block reads, arenas, loading
into the reference runtime."""

from __future__ import annotations

import json

import numpy as np
import pytest
from edgeflash.export.quantize import sqnr_db
from edgeflash.runtime.bundle import BLOCK_ALIGNMENT, TENSOR_ALIGNMENT, Bundle, load_bundle
from edgeflash.runtime.bundle.packed import unpack_array
from edgeflash.runtime.reference import ReferenceEngine
from edgeflash.runtime.tensors import dequantize_raw


def test_layout_rules_hold(tiny_bundle_dir):
    b = Bundle.open(tiny_bundle_dir)
    names = list(b.blocks)
    assert names[0] == "embedding" and names[-2:] == ["globals", "head"]
    assert names[1:4] == ["layer.0.attention", "layer.0.ffn", "layer.0.predictor"]
    assert len(names) == 1 + 3 * 3 + 2  # 3 layers
    end = 0
    for block in b.blocks.values():
        assert block.offset % BLOCK_ALIGNMENT == 0 and block.nbytes % BLOCK_ALIGNMENT == 0
        assert block.offset == end  # contiguous, file order
        end = block.offset + block.nbytes
    assert end == b.weights_path.stat().st_size
    for t in b.tensors.values():
        assert t.offset % TENSOR_ALIGNMENT == 0
        assert t.block == {"token_embd.weight": "embedding", "output.weight": "head",
                           "output_norm.weight": "globals"}.get(t.name, t.block)
    ffn = b.blocks["layer.1.ffn"]  # the FFN, stored once: its norm first, then its neuron arena
    assert set(ffn.tensors) == {"blk.1.ffn_norm.weight"}
    assert ffn.arena is not None and b.tensors["blk.1.ffn_norm.weight"].offset < ffn.arena.offset


def test_tensors_are_read_only_views_of_one_map(tiny_bundle_dir):
    source = load_bundle(tiny_bundle_dir)
    assert source.kind == "bundle"
    assert source.info["manifest"]["magic"] == "edgeflash-bundle"
    for t in source.tensors.values():
        assert not t.raw.flags.writeable
        assert not t.raw.flags.owndata
    b = source.info["bundle"]
    block = b.blocks["layer.0.attention"]
    view = b.block_view("layer.0.attention")
    q = source.tensors["blk.0.attn_q.weight"]
    start = b.tensors["blk.0.attn_q.weight"].offset
    np.testing.assert_array_equal(view[start:start + q.nbytes], q.raw.reshape(-1))
    assert view.nbytes == block.nbytes


def test_read_block_into_matches_the_map(tiny_bundle_dir):
    b = Bundle.open(tiny_bundle_dir)
    for name, block in b.blocks.items():
        buf = np.zeros(block.nbytes + 100, dtype=np.uint8)
        assert b.read_block_into(name, buf, verify=True) == block.nbytes
        np.testing.assert_array_equal(buf[:block.nbytes], b.block_view(name))
        for tname in block.tensors:
            np.testing.assert_array_equal(b.tensor_in(buf, tname).raw, b.tensor(tname).raw)
    with pytest.raises(ValueError, match="needs"):
        b.read_block_into("embedding", bytearray(10))
    with pytest.raises(ValueError, match="writable"):
        b.read_block_into("globals", bytes(b.blocks["globals"].nbytes))


def test_arena_holds_neurons_hot_first(tiny_bundle_dir, tiny_model):
    from edgeflash import kernels

    source = load_bundle(tiny_bundle_dir)
    b = source.info["bundle"]
    spec = source.spec
    manifest = source.info["manifest"]
    for layer in range(spec.n_layers):
        entry, arena = b.arena(layer)
        assert arena.shape == (spec.d_ff, entry.stride) and entry.stride % 64 == 0
        freq = np.asarray(manifest["calibration"]["neurons"]["frequency"][layer])
        assert np.all(np.diff(freq[entry.order]) <= 1e-6)  # hot first
        g = entry.part("gate")
        mlp = tiny_model[0].model.layers[layer].mlp  # the float weights the bundle was exported from
        # the kernel reads the arena as laid out: slot j = neuron order[j] (gate row, up row, down column)
        rows = {p.name: dequantize_raw(np.ascontiguousarray(arena[:, p.offset:p.offset + p.nbytes]), p.fmt,
                                       spec.d_model) for p in entry.parts}  # each [d_ff, d_model]
        x = np.random.default_rng(layer).standard_normal((3, spec.d_model)).astype(np.float32)
        g_pre = x @ rows["gate"].T
        expected = ((g_pre / (1 + np.exp(-g_pre))) * (x @ rows["up"].T)) @ rows["down"]
        sparse = kernels.ffn_sparse(np.ascontiguousarray(arena), x, np.arange(spec.d_ff), d_model=spec.d_model,
                                    gate_fmt=g.fmt, up_fmt=entry.part("up").fmt, down_fmt=entry.part("down").fmt,
                                    act="silu")
        assert np.abs(sparse - expected).max() < 0.02 * np.abs(expected).max()
        # gate rows and down columns are the model's, quantized, in hot-first order
        gate = mlp.gate_proj.weight.detach().numpy()  # [d_ff, d_model]
        down = mlp.down_proj.weight.detach().numpy()  # [d_model, d_ff]
        assert sqnr_db(gate[entry.order], rows["gate"]) > 14.0
        assert sqnr_db(np.ascontiguousarray(down.T[entry.order]), rows["down"]) > 14.0
        # arena_in over a buffer filled by a positioned read sees the same bytes
        block = b.arena_block(layer)
        buf = bytearray(block.nbytes)
        b.read_block_into(block.name, buf)
        np.testing.assert_array_equal(b.arena_in(buf, layer), arena)


def test_bundle_runs_in_the_reference_engine(tiny_bundle_dir):
    source = load_bundle(tiny_bundle_dir)
    engine = ReferenceEngine(source)
    logits = engine.forward(source.tokenizer.encode("To be, or not to be"), all_logits=True)
    assert logits.shape[1] == source.spec.vocab_size and np.isfinite(logits).all()


def test_manifest_has_every_section(tiny_bundle_dir):
    m = json.loads((tiny_bundle_dir / "manifest.json").read_text())
    assert {"magic", "format_version", "model", "source", "quant", "tokenizer", "weights", "blocks", "tensors",
            "calibration", "report"} <= set(m)
    assert m["source"]["kind"] == "torch"
    cal = m["calibration"]
    n_layers = m["model"]["spec"]["n_layers"]
    assert len(cal["sparsity"]["act_threshold"]) == n_layers
    for row in cal["sparsity"]["act_threshold"]:
        assert row == sorted(row) and row[0] > 0  # larger target sparsity, larger threshold
    assert len(cal["predictors"]["recall"]) == n_layers
    ids = unpack_array(cal["token_frequencies"]["ids"], "ids")
    assert 0 < len(ids) <= 64
    counts = unpack_array(cal["token_frequencies"]["counts"], "counts").tolist()
    assert counts == sorted(counts, reverse=True)
    assert m["report"]["perplexity"]["exported"] > 1.0


TABLES_SCRIPT = """
import sys
from edgeflash.runtime.bundle import Bundle
sys.stdout.buffer.write(Bundle.open(sys.argv[1], verify=False).tokenizer().tables())
"""


def test_tokenizer_tables_are_read_instead_of_built(tiny_bundle_dir):
    """The bundle carries the tokenizer's tables: opening reads them instead of building them from
    tokenizer.json, with the same encoding, and they come out byte for byte the same in another
    process (no per-process hash salt in them)."""
    import subprocess
    import sys

    from edgeflash.runtime.tokenizer import Tokenizer

    stored = (tiny_bundle_dir / "tokenizer.tables").read_bytes()
    other_process = subprocess.run([sys.executable, "-c", TABLES_SCRIPT, str(tiny_bundle_dir)], capture_output=True,
                                   check=True, timeout=300).stdout
    assert other_process == stored
    built = Tokenizer.from_dict(json.loads((tiny_bundle_dir / "tokenizer.json").read_text()))
    read = Bundle.open(tiny_bundle_dir, verify=False).tokenizer()
    text = "Opening a bundle reads its tokenizer's tables: 12 ids, naïve café, <|im_start|> and all."
    assert read.encode(text) == built.encode(text) and len(read.encode(text)) > 10
    assert read.decode(read.encode(text)) == built.decode(built.encode(text))
