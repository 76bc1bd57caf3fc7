"""A damaged bundle is refused with a message that says what is wrong and where."""

from __future__ import annotations

import json
import os

import pytest
from edgeflash.base.errors import IntegrityError, ModelFormatError, UnsupportedModelError
from edgeflash.runtime.bundle import Bundle, load_bundle
from edgeflash.runtime.bundle.packed import is_packed, pack_array, unpack_array


def _flip(path, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0x5A]))


def test_a_flipped_byte_in_any_block_names_that_block(bundle_copy):
    blocks = Bundle.open(bundle_copy).blocks
    weights = bundle_copy / "weights.bin"
    for name, block in blocks.items():
        for offset in (block.offset, block.offset + block.data_nbytes // 2, block.offset + block.nbytes - 1):
            _flip(weights, offset)
            with pytest.raises(IntegrityError, match=f"checksum mismatch in block {name} "):
                load_bundle(bundle_copy)
            _flip(weights, offset)  # restore
    load_bundle(bundle_copy)  # intact again


def test_read_block_into_verifies_on_request(bundle_copy):
    b = Bundle.open(bundle_copy)
    block = b.blocks["layer.1.ffn"]
    _flip(bundle_copy / "weights.bin", block.offset + 100)
    buf = bytearray(block.nbytes)
    b.read_block_into("layer.1.ffn", buf)  # no verification: reads what is there
    with pytest.raises(IntegrityError, match="block layer.1.ffn"):
        b.read_block_into("layer.1.ffn", buf, verify=True)


def test_tensor_checksums(bundle_copy):
    b = Bundle.open(bundle_copy)
    for name in b.tensors:
        b.verify_tensor(name, b.tensor(name).raw)
    raw = bytearray(b.tensor("blk.2.ffn_norm.weight").raw.tobytes())
    raw[3] ^= 1
    with pytest.raises(IntegrityError, match="tensor blk.2.ffn_norm.weight \\(block layer.2.ffn\\)"):
        b.verify_tensor("blk.2.ffn_norm.weight", raw)


def test_modified_tokenizer_is_detected(bundle_copy):
    path = bundle_copy / "tokenizer.json"
    path.write_bytes(path.read_bytes().replace(b'"', b"'", 1))
    with pytest.raises(IntegrityError, match="tokenizer.json: checksum mismatch"):
        load_bundle(bundle_copy)


def test_modified_tokenizer_tables_are_detected(bundle_copy):
    _flip(bundle_copy / "tokenizer.tables", 100)
    with pytest.raises(IntegrityError, match="tokenizer.tables: checksum mismatch"):
        load_bundle(bundle_copy)
    with pytest.raises(IntegrityError, match="tokenizer.tables: checksum mismatch"):
        Bundle.open(bundle_copy, verify=False).tokenizer()  # checked even when blocks are not


def test_tables_of_another_format_fall_back_to_tokenizer_json(bundle_copy):
    """A bundle written by an edgeflash whose tables differ is read from its tokenizer.json."""
    text = "Tables of another format: the tokenizer is built from tokenizer.json instead."
    expected = Bundle.open(bundle_copy, verify=False).tokenizer().encode(text)
    _edit_manifest(bundle_copy, lambda m: m["tokenizer"]["tables"].update(format=999))
    (bundle_copy / "tokenizer.tables").write_bytes(b"not tables")  # never read
    assert load_bundle(bundle_copy, verify=False).tokenizer.encode(text) == expected


def test_truncated_weights_are_rejected(bundle_copy):
    weights = bundle_copy / "weights.bin"
    size = weights.stat().st_size
    os.truncate(weights, size - 4096)
    with pytest.raises(ModelFormatError, match=f"weights.nbytes = {size} but weights.bin has {size - 4096} bytes"):
        load_bundle(bundle_copy)


def _edit_manifest(bundle_dir, edit) -> None:
    path = bundle_dir / "manifest.json"
    m = json.loads(path.read_text())
    edit(m)
    path.write_text(json.dumps(m))


def _tensor(m, name):
    return next(t for t in m["tensors"] if t["name"] == name)


def _block(m, name):
    return next(b for b in m["blocks"] if b["name"] == name)


def _arena(m):
    return _block(m, "layer.0.ffn")["arena"]


@pytest.mark.parametrize("edit,error,fragment", [
    (lambda m: m.update(magic="gguf-bundle"), ModelFormatError, "not an edgeflash bundle"),
    (lambda m: m.update(format_version=99), UnsupportedModelError, "bundle format version 99 is not supported"),
    (lambda m: m["weights"].update(file="../../etc/passwd"), ModelFormatError, "weights.file"),
    (lambda m: m["tokenizer"].update(file="/tmp/tok.json"), ModelFormatError, "tokenizer.file"),
    (lambda m: _block(m, "head").update(offset=_block(m, "head")["offset"] + 4096), ModelFormatError,
     "block head .* runs past the end of weights.bin"),
    (lambda m: _block(m, "globals").update(offset=_block(m, "globals")["offset"] + 100), ModelFormatError,
     "must be multiples of 4096"),
    (lambda m: _block(m, "layer.0.ffn").update(offset=_block(m, "layer.0.attention")["offset"]), ModelFormatError,
     "overlaps the block before it"),
    (lambda m: _tensor(m, "blk.0.attn_k.weight").update(offset=10 ** 9), ModelFormatError,
     "tensor blk.0.attn_k.weight .* runs past the end of the block's data"),
    (lambda m: _tensor(m, "blk.0.attn_k.weight").update(offset=_tensor(m, "blk.0.attn_q.weight")["offset"]),
     ModelFormatError, "overlap"),
    (lambda m: _tensor(m, "blk.0.attn_k.weight").update(nbytes=12), ModelFormatError, "nbytes = 12 but shape"),
    (lambda m: _tensor(m, "blk.0.attn_k.weight").update(offset=8), ModelFormatError, "not a multiple of 64"),
    (lambda m: _tensor(m, "blk.0.attn_k.weight").update(format="q9_9"), ModelFormatError, "'q9_9' is not a known"),
    (lambda m: _tensor(m, "blk.0.attn_k.weight").update(block="nowhere"), ModelFormatError,
     "block 'nowhere' is not in the block table"),
    (lambda m: _arena(m).update(order=pack_array([0] * _arena(m)["n_neurons"], "int32")), ModelFormatError,
     "order must be a permutation"),
    (lambda m: _arena(m).update(order=[0] * _arena(m)["n_neurons"]), ModelFormatError,  # format 1: a plain list
     "order must be a permutation"),
    (lambda m: _arena(m)["order"].update(base64=_arena(m)["order"]["base64"][:-8]), ModelFormatError,
     r"blocks\[\d+\]\.arena\.order: \d+ bytes do not hold int32 values of shape"),
    (lambda m: m["calibration"]["neurons"]["frequency"][0].update(dtype="float16"), ModelFormatError,
     r"calibration\.neurons\.frequency\[0\]\.dtype = 'float16'"),
    (lambda m: m["calibration"]["token_frequencies"]["ids"].update(base64="not base64!"), ModelFormatError,
     r"calibration\.token_frequencies\.ids\.base64: not valid base64"),
    (lambda m: _block(m, "layer.0.ffn")["arena"].update(n_neurons=10 ** 6), ModelFormatError,
     "neuron arena of block layer.0.ffn .* runs past the end"),
    (lambda m: _arena(m)["parts"][1].update(format="q8_0", nbytes=68), ModelFormatError,
     "must hold gate and up in one format"),
    (lambda m: m["blocks"].append(dict(_block(m, "globals"), name="globals")), ModelFormatError, "appears twice"),
    (lambda m: m.pop("blocks"), ModelFormatError, "blocks is missing"),
    (lambda m: m.update(tensors="all of them"), ModelFormatError, "tensors = 'all of them': expected list"),
])
def test_bad_manifests_are_rejected(bundle_copy, edit, error, fragment):
    _edit_manifest(bundle_copy, edit)
    with pytest.raises(error, match=fragment) as info:
        load_bundle(bundle_copy)
    assert "manifest.json" in str(info.value) or "format version" in str(info.value)


def test_not_a_bundle(tmp_path):
    (tmp_path / "manifest.json").write_text("{not json")
    (tmp_path / "weights.bin").write_bytes(b"")
    with pytest.raises(ModelFormatError, match="not valid JSON"):
        load_bundle(tmp_path)
    with pytest.raises(ModelFormatError, match="no manifest.json"):
        Bundle.open(tmp_path / "elsewhere")


def _unpacked(value):
    """A manifest value with every packed array written out as JSON lists (format 1)."""
    if is_packed(value):
        return unpack_array(value, "value").tolist()
    if isinstance(value, dict):
        return {k: _unpacked(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_unpacked(v) for v in value]
    return value


def _longest_number_list(value) -> int:
    if isinstance(value, dict):
        return max((_longest_number_list(v) for v in value.values()), default=0)
    if isinstance(value, list):
        own = len(value) if value and all(isinstance(v, (int, float)) for v in value) else 0
        return max([own] + [_longest_number_list(v) for v in value])
    return 0


def test_long_arrays_are_packed_and_format_1_lists_still_read(bundle_copy):
    raw = json.loads((bundle_copy / "manifest.json").read_text())
    # The tiny model's layers are 96 neurons wide and its token list 64 long: nothing that long
    # stays a JSON list (each number would be a Python object while the manifest is read).
    assert _longest_number_list(raw) < 64
    packed = load_bundle(bundle_copy).info["manifest"]
    _edit_manifest(bundle_copy, lambda m: m.update(_unpacked(m), format_version=1))
    assert _longest_number_list(json.loads((bundle_copy / "manifest.json").read_text())) >= 64
    listed = load_bundle(bundle_copy).info["manifest"]
    for section, key in (("neurons", "frequency"), ("neurons", "order"), ("token_frequencies", "ids"),
                         ("token_frequencies", "counts")):
        a, b = packed["calibration"][section][key], listed["calibration"][section][key]
        assert type(a) is type(b) and len(a) == len(b) and a == b, (section, key)
    for pa, pb in zip(packed["blocks"], listed["blocks"]):
        assert (pa["arena"] or {}).get("order") == (pb["arena"] or {}).get("order")
