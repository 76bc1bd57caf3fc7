"""Hugging Face directories are untrusted too: sidecar files are opened only if they are regular
files and read only up to a size limit, JSON nesting is bounded, config fields are type-checked
before a spec is built, and a safetensors header must describe its data exactly."""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import numpy as np
import pytest
from edgeflash.base.errors import ModelFormatError, UnsupportedModelError
from edgeflash.runtime.sources import open_model
from edgeflash.runtime.sources.hf import load_hf_tokenizer, read_json
from edgeflash.runtime.sources.safetensors_file import read_safetensors

CONFIG = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
          "num_key_value_heads": 2, "num_hidden_layers": 2, "vocab_size": 100, "rms_norm_eps": 1e-5}


def _model_dir(tmp_path: Path, **config_changes) -> Path:
    path = tmp_path / "model"
    path.mkdir()
    (path / "config.json").write_text(json.dumps({**CONFIG, **config_changes}))
    return path


@pytest.mark.parametrize("field, value, fragment", [
    ("hidden_size", "64", "hidden_size = '64'"),
    ("num_hidden_layers", 10**12, "an integer in 1..65536"),
    ("num_key_value_heads", 3, "a divisor of num_attention_heads (4)"),
    ("rms_norm_eps", -1.0, "rms_norm_eps = -1.0"),
    ("rope_theta", "big", "rope_theta = 'big'"),
    ("layer_types", ["full_attention"], "one string per layer"),
    ("num_attention_heads", True, "num_attention_heads = True"),
])
def test_config_fields_are_checked_before_the_spec(tmp_path, field, value, fragment):
    with pytest.raises(ModelFormatError, match=None) as caught:
        open_model(_model_dir(tmp_path, **{field: value}))
    assert fragment in str(caught.value) and "config.json" in str(caught.value)


def test_deeply_nested_config_is_refused(tmp_path):
    path = _model_dir(tmp_path)
    (path / "config.json").write_text('{"model_type": "llama", "x": ' + "[" * 50_000 + "]" * 50_000 + "}")
    with pytest.raises(ModelFormatError, match="deeper than 64 levels"):
        read_json(path / "config.json")


@pytest.mark.parametrize("kind", ["fifo", "dev_zero", "directory", "symlink_loop"])
def test_tokenizer_json_must_be_a_regular_file(tmp_path, kind):
    path = _model_dir(tmp_path)
    tok = path / "tokenizer.json"
    if kind == "fifo":
        os.mkfifo(tok)
    elif kind == "dev_zero":
        tok.symlink_to("/dev/zero")
    elif kind == "directory":
        tok.mkdir()
    else:
        tok.symlink_to(tok.name)
    with pytest.raises(ModelFormatError):
        load_hf_tokenizer(path)


def test_sidecar_files_have_a_size_limit(tmp_path):
    path = _model_dir(tmp_path)
    template = path / "chat_template.jinja"
    with open(template, "wb") as f:
        f.truncate(5 << 20)  # 5 MB of holes: refused by size, never read
    (path / "tokenizer.json").write_text("{}")
    with pytest.raises(ModelFormatError, match="chat_template.jinja is 5242880 bytes; at most 4194304"):
        load_hf_tokenizer(path)


def _safetensors(path: Path, header: dict, data: bytes) -> Path:
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data)
    return path


def test_safetensors_reads_a_valid_file(tmp_path):
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    path = _safetensors(tmp_path / "ok.safetensors", {"a": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]}},
                        a.tobytes())
    fmt, shape, raw = read_safetensors(path)["a"]
    assert (fmt, shape) == ("f32", (2, 3)) and np.array_equal(raw.view(np.float32).reshape(2, 3), a)


@pytest.mark.parametrize("header, fragment", [
    ({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
      "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}, "overlaps"),
    ({"a": {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]}}, "belong to no tensor"),
    ({"a": {"dtype": "F32", "shape": [2**40, 2**40], "data_offsets": [0, 16]}}, "does not fit shape"),
    ({"a": {"dtype": "F32", "shape": "2", "data_offsets": [0, 16]}}, "expected a list of at most 8 integers"),
    ({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 2**70]}}, "data_offsets"),
    ({"a": [1, 2]}, "expected an object with dtype, shape and data_offsets"),
    ({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}, "cover 8 bytes of the 16-byte"),
])
def test_safetensors_header_must_describe_the_data(tmp_path, header, fragment):
    path = _safetensors(tmp_path / "bad.safetensors", header, bytes(16))
    with pytest.raises(ModelFormatError) as caught:
        read_safetensors(path)
    assert fragment in str(caught.value), str(caught.value)


def test_safetensors_unknown_dtype_is_unsupported(tmp_path):
    path = _safetensors(tmp_path / "i8.safetensors", {"a": {"dtype": "I8", "shape": [4], "data_offsets": [0, 4]}},
                        bytes(4))
    with pytest.raises(UnsupportedModelError, match="dtype 'I8'"):
        read_safetensors(path)
