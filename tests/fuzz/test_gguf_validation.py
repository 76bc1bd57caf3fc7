"""The GGUF validation layer, one fault at a time: each malformed file is refused with one line
naming the file, the field, its value and what was expected, before anything is built from it;
files that only look unusual (another tensor order, a trailing dimension of 1) still load.

The files are the tiny random model of `tiny_gguf` with one part rewritten (`gguf_image`)."""

from __future__ import annotations

import math
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from edgeflash.base.errors import ModelFormatError, UnsupportedModelError, UserError
from edgeflash.runtime.sources import open_model
from gguf_image import (
    ARRAY,
    BOOL,
    FLOAT32,
    KV,
    STRING,
    UINT8,
    UINT32,
    UINT64,
    GGUFImage,
    TensorEntry,
    encode_value,
)
from fuzz_tiny_gguf import build_tiny_gguf

EDGEFLASH = str(Path(sys.executable).parent / "edgeflash")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, smollm_path) -> GGUFImage:
    return GGUFImage.read(build_tiny_gguf(smollm_path, tmp_path_factory.mktemp("tiny") / "tiny.gguf"))


def _kv(image: GGUFImage, key: str, kv: KV) -> GGUFImage:
    out = image.clone()
    index = out.kv_index(key)
    if index is None:
        out.kvs.append(kv)
    else:
        out.kvs[index] = kv
    return out


def _tensor(image: GGUFImage, tensor: str, **changes) -> GGUFImage:
    out = image.clone()
    index = out.tensor_index(tensor)
    t = out.tensors[index]
    out.tensors[index] = TensorEntry(changes.get("name", t.name), changes.get("dims", t.dims),
                                     changes.get("ggml_type", t.ggml_type), changes.get("offset", t.offset))
    return out


def _refused(image: GGUFImage, tmp_path: Path, *fragments: str, error: type = ModelFormatError) -> str:
    path = image.write(tmp_path / "mutant.gguf")
    with pytest.raises(error) as caught:
        open_model(path)
    message = str(caught.value)
    assert str(path) in message and "\n" not in message, message
    for fragment in fragments:
        assert fragment in message, message
    return message


def _tiny_int(key: str, value: int, vtype: int = UINT32) -> KV:
    return KV.make(key, vtype, value)


def test_unmutated_tiny_model_loads(tiny):
    source = open_model(tiny.source)
    assert source.spec.n_layers == 2 and source.spec.d_model == 64


# -- metadata types and ranges --------------------------------------------------------------------


@pytest.mark.parametrize("key, kv, fragments", [
    ("llama.block_count", KV.make("llama.block_count", FLOAT32, 2.0), ["llama.block_count = 2.0 (float32)",
                                                                          "expected an integer"]),
    ("llama.block_count", _tiny_int("llama.block_count", 1), ["llama.block_count = 1", "expected 2, the number"]),
    ("llama.block_count", _tiny_int("llama.block_count", 2**32 - 1), ["expected an integer in 1..65536"]),
    ("llama.attention.head_count_kv", _tiny_int("llama.attention.head_count_kv", 0),
     ["llama.attention.head_count_kv = 0", "expected an integer in 1..4096"]),
    ("llama.attention.head_count_kv", _tiny_int("llama.attention.head_count_kv", 3),
     ["head_count_kv = 3", "a divisor of llama.attention.head_count (4)"]),
    ("llama.attention.head_count", KV.make("llama.attention.head_count", BOOL, True), ["(bool)", "an integer"]),
    ("llama.feed_forward_length", _tiny_int("llama.feed_forward_length", 2**40, UINT64),
     ["llama.feed_forward_length = 1099511627776", "an integer in 1..4194304"]),
    ("llama.feed_forward_length", _tiny_int("llama.feed_forward_length", 1 << 20),
     ["blk.0.ffn_gate.weight", "has shape [128, 64]", "implies [1048576, 64]"]),
    ("llama.embedding_length", KV.make("llama.embedding_length", STRING, "64"), ["'64' (string)"]),
    ("llama.attention.layer_norm_rms_epsilon", KV.make("llama.attention.layer_norm_rms_epsilon", FLOAT32, math.nan),
     ["layer_norm_rms_epsilon = nan", "a finite number in (0, 1)"]),
    ("llama.rope.freq_base", KV.make("llama.rope.freq_base", FLOAT32, math.inf), ["freq_base = inf", "> 0"]),
    ("llama.rope.freq_base", KV.make("llama.rope.freq_base", FLOAT32, 0.0), ["freq_base = 0.0", "> 0"]),
    ("llama.context_length", _tiny_int("llama.context_length", 0), ["context_length = 0"]),
    ("tokenizer.ggml.bos_token_id", _tiny_int("tokenizer.ggml.bos_token_id", 49152),
     ["tokenizer.ggml.bos_token_id = 49152", "0..49151"]),
    ("tokenizer.ggml.add_bos_token", KV.make("tokenizer.ggml.add_bos_token", UINT8, 1), ["(uint8)", "true or false"]),
    ("general.architecture", KV.make("general.architecture", STRING, "\x1b]0;owned\x07"), ["\\x1b]0;owned\\x07"]),
])
def test_metadata_field_refused(tiny, tmp_path, key, kv, fragments):
    error = UnsupportedModelError if key == "general.architecture" else ModelFormatError
    message = _refused(_kv(tiny, key, kv), tmp_path, *fragments, error=error)
    assert "\x1b" not in message and "\x07" not in message


@pytest.mark.parametrize("value, vtype", [(0, UINT32), (1, UINT32), (3, UINT32), (24, UINT32), (2**31, UINT32),
                                          ("32", STRING), (32.0, FLOAT32)])
def test_alignment_must_be_a_power_of_two_of_at_least_8(tiny, tmp_path, value, vtype):
    _refused(_kv(tiny, "general.alignment", KV.make("general.alignment", vtype, value)), tmp_path,
             "general.alignment", "expected an integer power of two in 8..")


def test_nested_arrays_are_read_without_recursion_and_limited(tiny, tmp_path):
    def nested(depth: int) -> KV:
        # depth - 1 array headers, then the innermost array (built in one piece: prepending a header
        # at a time copies the payload 100 000 times)
        payload = struct.pack("<IQ", ARRAY, 1) * (depth - 1) + struct.pack("<IQ", UINT8, 1) + b"\x01"
        return KV(b"fuzz.nested", ARRAY, payload)

    open_model(_kv(tiny, "fuzz.nested", nested(8)).write(tmp_path / "eight.gguf"))  # deep, but allowed
    _refused(_kv(tiny, "fuzz.nested", nested(100_000)), tmp_path, "nests arrays more than 8 levels deep")


def test_array_counts_are_bounded_before_allocation(tiny, tmp_path):
    tokens = tiny.kv("tokenizer.ggml.tokens")
    for count in (2**40, 2**64 - 1):
        kv = KV(tokens.key, ARRAY, struct.pack("<IQ", STRING, count) + tokens.payload[12:])
        _refused(_kv(tiny, "tokenizer.ggml.tokens", kv), tmp_path, "tokenizer.ggml.tokens")


@pytest.mark.parametrize("key, etype, value, fragment", [
    ("tokenizer.ggml.token_type", 5, [1] * 49151 + [99], "token_type[49151] = 99"),
    ("tokenizer.ggml.scores", FLOAT32, [0.0] * 49151 + [math.nan], "scores[49151] = nan"),
])
def test_tokenizer_arrays_checked(tiny, tmp_path, key, etype, value, fragment):
    _refused(_kv(tiny, key, KV.make(key, ARRAY, (etype, value))), tmp_path, fragment)


def test_duplicate_key_refused(tiny, tmp_path):
    out = tiny.clone()
    out.kvs.append(KV.make("llama.block_count", UINT32, 2))
    _refused(out, tmp_path, "'llama.block_count' appears twice")


# -- the tensor table -----------------------------------------------------------------------------


def test_offset_aliasing_another_tensor_refused(tiny, tmp_path):
    other = tiny.tensors[tiny.tensor_index("blk.0.attn_q.weight")]
    _refused(_tensor(tiny, "blk.0.attn_k.weight", offset=other.offset), tmp_path, "overlaps tensor")


def test_misaligned_offset_refused(tiny, tmp_path):
    t = tiny.tensors[tiny.tensor_index("blk.1.ffn_up.weight")]
    _refused(_tensor(tiny, "blk.1.ffn_up.weight", offset=t.offset + 4), tmp_path, "not a multiple of the alignment 32")


def test_offset_past_the_end_refused(tiny, tmp_path):
    _refused(_tensor(tiny, "blk.1.ffn_up.weight", offset=2**64 - 32), tmp_path, "blk.1.ffn_up.weight",
             "truncated GGUF file")


def test_f32_relabelled_bf16_refused(tiny, tmp_path):
    # Half the bytes: the tensor no longer covers what the file stores for it.
    _refused(_tensor(tiny, "blk.0.attn_norm.weight", ggml_type=30), tmp_path, "belong to no tensor",
             "type or shape does not match")


def test_swapped_dimensions_refused(tiny, tmp_path):
    _refused(_tensor(tiny, "blk.0.ffn_gate.weight", dims=[128, 64]), tmp_path, "'blk.0.ffn_gate.weight' has shape "
             "[64, 128]", "implies [128, 64]")


def test_layer_beyond_block_count_refused(tiny, tmp_path):
    _refused(_tensor(tiny, "blk.1.ffn_up.weight", name=b"blk.7.ffn_up.weight"), tmp_path, "llama.block_count = 2",
             "expected 8")


def _hostile_names(image: GGUFImage, name: bytes) -> GGUFImage:
    """Two tensors given the same name, which the error then quotes."""
    return _tensor(_tensor(image, "blk.1.ffn_up.weight", name=name), "blk.1.ffn_gate.weight", name=name)


def test_tensor_name_with_escape_sequences_is_shown_escaped(tiny, tmp_path):
    message = _refused(_hostile_names(tiny, b"blk.1.ffn_up.weight\x1b[2J\x1b[31m"), tmp_path, "\\x1b[2J",
                       "appears twice")
    assert "\x1b" not in message


def test_unknown_tensor_type_refused(tiny, tmp_path):
    _refused(_tensor(tiny, "blk.1.ffn_up.weight", ggml_type=39), tmp_path, "unknown GGML tensor type 39",
             error=UnsupportedModelError)


def test_trailing_bytes_refused(tiny, tmp_path):
    out = tiny.clone()
    out.append = b"\0" * 32
    _refused(out, tmp_path, "32 bytes after the last tensor")


def test_equivalent_layouts_still_load(tiny, tmp_path):
    """Another tensor order and GGML's trailing dimension of 1 describe the same model."""
    out = tiny.clone()
    out.tensors.reverse()
    t = out.tensors[out.tensor_index("blk.0.ffn_down.weight")]
    out.tensors[out.tensor_index("blk.0.ffn_down.weight")] = TensorEntry(t.name, t.dims + [1], t.ggml_type, t.offset)
    source = open_model(out.write(tmp_path / "same.gguf"))
    assert source.tensors["blk.0.ffn_down.weight"].shape == (64, 128)


# -- what the path names --------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["fifo", "dev_zero", "directory", "symlink_loop", "empty"])
def test_only_regular_files_are_opened(tmp_path, kind):
    path = tmp_path / "model.gguf"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "dev_zero":
        path.symlink_to("/dev/zero")
    elif kind == "directory":
        path.mkdir()
    elif kind == "symlink_loop":
        path.symlink_to(path)
    else:
        path.touch()
    with pytest.raises(UserError):
        open_model(path)


def test_cli_error_is_one_escaped_line_without_hanging(tiny, tmp_path):
    fifo = tmp_path / "pipe.gguf"
    os.mkfifo(fifo)
    hostile = _hostile_names(tiny, b"\x1b]0;title\x07blk.1.ffn_up.weight").write(tmp_path / "hostile.gguf")
    for path, fragment in ((fifo, "FIFO"), (hostile, "\\x1b]0;title\\x07")):
        for argv in (["generate", "-m", str(path), "-p", "hi"], ["inspect", str(path)]):
            done = subprocess.run([EDGEFLASH, *argv], capture_output=True, timeout=120, check=False)
            assert done.returncode == 2, done.stderr
            lines = done.stderr.decode().splitlines()
            assert len(lines) == 1 and lines[0].startswith("edgeflash: error: ") and fragment in lines[0], lines
            assert b"\x1b" not in done.stderr and b"\x07" not in done.stderr


def test_inspect_describes_a_valid_gguf(tiny):
    done = subprocess.run([EDGEFLASH, "inspect", str(tiny.source)], capture_output=True, timeout=120, check=True)
    text = done.stdout.decode()
    assert "llama/llama: 2 layers, d_model 64" in text and "q4_0" in text and "bf16" in text


@pytest.mark.parametrize("alias,shown", [("qwen2.5-coder-0.5b", "llama/qwen2: 24 layers, d_model 896"),
                                         ("smollm2-135m", "llama/llama: 30 layers, d_model 576"),
                                         ("gemma3-270m", "gemma3/gemma3: 18 layers, d_model 640")])
def test_inspect_describes_the_real_gguf_files_by_path_and_alias(alias, shown):
    """`inspect` on a GGUF file describes it (it once tried to read FILE/manifest.json and died)."""
    from edgeflash.base.models import resolve_model

    for name in (str(resolve_model(alias)), alias):
        done = subprocess.run([EDGEFLASH, "inspect", name], capture_output=True, timeout=300, check=False)
        assert done.returncode == 0 and not done.stderr, done.stderr[-2000:]
        assert shown in done.stdout.decode()


def test_encode_value_round_trips():
    # The fuzzer's own encoder, for the arrays these tests write.
    assert encode_value(ARRAY, (UINT8, [1, 2])) == struct.pack("<IQ", UINT8, 2) + b"\x01\x02"


def test_model_name_from_the_file_is_kept_visible(tiny, tmp_path):
    """general.name is shown in banners and warnings: its control characters arrive escaped."""
    hostile = _kv(tiny, "general.name", KV.make("general.name", STRING, "tiny\x1b[2J\x1b]0;owned\x07"))
    source = open_model(hostile.write(tmp_path / "named.gguf"))
    assert source.name == "tiny\\x1b[2J\\x1b]0;owned\\x07"
