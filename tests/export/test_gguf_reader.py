"""Our GGUF header parser against the `gguf` package's reader, and its errors on bad files."""

from __future__ import annotations

import numpy as np
import pytest
from edgeflash.base.errors import ModelFormatError, UnsupportedModelError
from edgeflash.kernels.formats import FORMAT_BY_GGML_TYPE
from edgeflash.runtime.sources.gguf import GGUFFile


@pytest.fixture(scope="module")
def gguf_reader():
    """reader(path) -> the `gguf` package's GGUFReader of a file, parsed once for the module (it
    reads every metadata field in Python: seconds for Gemma 3's vocabulary); it only reads."""
    import gguf

    made: dict = {}

    def reader(path):
        if str(path) not in made:
            made[str(path)] = gguf.GGUFReader(str(path))
        return made[str(path)]

    return reader


@pytest.mark.parametrize("alias", ["gemma3-270m", "smollm2-135m"])
def test_matches_gguf_package(model_path, gguf_reader, alias):
    path = model_path(alias)
    ours = GGUFFile(path)
    theirs = gguf_reader(path)
    assert len(ours.tensors) == len(theirs.tensors)
    for t in theirs.tensors:
        info = ours.tensors[t.name]
        assert info.offset == t.data_offset
        assert info.nbytes == t.n_bytes
        assert info.fmt == FORMAT_BY_GGML_TYPE[int(t.tensor_type)].name
        assert info.shape == tuple(int(d) for d in reversed(t.shape.tolist()))
    # metadata: every scalar and the vocabulary agree
    for name, field in theirs.fields.items():
        if name.startswith("GGUF."):
            continue
        value = ours.metadata[name]
        if name == "tokenizer.ggml.tokens":
            assert value[:1000] == [bytes(field.parts[i]).decode() for i in field.data[:1000]]
            assert len(value) == len(field.data)
        elif not isinstance(value, list):
            theirs_value = field.contents()
            assert value == pytest.approx(theirs_value) if isinstance(value, float) else value == theirs_value


def test_tensor_bytes_dequantize_like_gguf(gemma_path, gguf_reader):
    import gguf

    f = GGUFFile(gemma_path)
    reader = gguf_reader(gemma_path)
    by_name = {t.name: t for t in reader.tensors}
    for name in ["blk.0.attn_q.weight", "blk.0.ffn_down.weight", "blk.0.attn_output.weight", "blk.0.attn_v.weight"]:
        ours = f.tensor(name).dequantize()
        t = by_name[name]
        theirs = gguf.quants.dequantize(t.data, t.tensor_type).reshape(ours.shape)
        np.testing.assert_allclose(ours, theirs, rtol=0, atol=1e-6)


def test_not_gguf(tmp_path):
    p = tmp_path / "notes.gguf"
    p.write_text("hello, this is not a model file at all")
    with pytest.raises(ModelFormatError, match="not a GGUF file"):
        GGUFFile(p)


def test_missing_file(tmp_path):
    with pytest.raises(ModelFormatError, match="no such file"):
        GGUFFile(tmp_path / "absent.gguf")


@pytest.mark.parametrize("keep", [100, 5_000_000, -1000])
def test_truncated(smollm_path, tmp_path, keep):
    data = smollm_path.read_bytes()
    p = tmp_path / "cut.gguf"
    p.write_bytes(data[:keep] if keep > 0 else data[:keep])
    with pytest.raises(ModelFormatError, match="truncated"):
        GGUFFile(p)


def test_unknown_tensor_type(smollm_path, tmp_path):
    data = bytearray(smollm_path.read_bytes())
    # Find the type field of the first tensor info: name, n_dims, dims, then the u32 type.
    name = b"token_embd.weight"
    at = data.index(name) + len(name)
    n_dims = int.from_bytes(data[at:at + 4], "little")
    type_at = at + 4 + 8 * n_dims
    assert int.from_bytes(data[type_at:type_at + 4], "little") == 8  # q8_0, as the file says
    data[type_at:type_at + 4] = (999).to_bytes(4, "little")
    p = tmp_path / "odd.gguf"
    p.write_bytes(bytes(data))
    with pytest.raises(UnsupportedModelError, match="unknown GGML tensor type 999"):
        GGUFFile(p)


def test_a_model_with_the_same_tokenizer_metadata_reuses_the_opened_tokenizer(smollm_path, gemma_path):
    """A draft model opened beside its target takes the target's tokenizer instead of building its
    own, when every tokenizer value but the chat template is the same."""
    from edgeflash.runtime.sources import open_model
    from edgeflash.runtime.sources.gguf import tokenizer_fingerprint

    smol = open_model(smollm_path)
    again = open_model(smollm_path, tokenizer_of=smol)
    assert again.tokenizer is smol.tokenizer
    gemma = open_model(gemma_path, tokenizer_of=smol)  # another tokenizer: built from its own metadata
    assert gemma.tokenizer is not smol.tokenizer
    assert gemma.tokenizer.encode("Hello world") != smol.tokenizer.encode("Hello world")

    meta = {"tokenizer.ggml.tokens": ["a", "b", "ab"], "tokenizer.ggml.merges": ["a b"],
            "tokenizer.ggml.eos_token_id": 2, "tokenizer.chat_template": "{{ messages }}", "general.name": "x"}
    same = {**meta, "tokenizer.chat_template": "another template", "general.name": "y"}
    assert tokenizer_fingerprint(meta) == tokenizer_fingerprint(same)
    for changed in ({"tokenizer.ggml.eos_token_id": 1}, {"tokenizer.ggml.tokens": ["a", "b", "ba"]},
                    {"tokenizer.ggml.merges": ["a b", ""]}, {"tokenizer.ggml.add_bos_token": True}):
        assert tokenizer_fingerprint({**meta, **changed}) != tokenizer_fingerprint(meta)
