"""The compact forms behind the tokenizer agree with the plain structures they replace: a list of
texts with a {text: id} dict (a later duplicate wins), a {(left, right): (rank, merged)} dict,
and the id -> text overlay of added tokens. Plus: a tokenizer assembled lazily by several
threads at once gives the same ids."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from edgeflash.export.corpus import heldout_text
from edgeflash.runtime.sources.gguf import read_metadata
from edgeflash.runtime.tokenizer import Tokenizer
from edgeflash.runtime.tokenizer.merge_table import MergeTable
from edgeflash.runtime.tokenizer.packing import pack, unpack
from edgeflash.runtime.tokenizer.vocab import Vocabulary


@pytest.fixture(scope="module")
def smollm_spec(smollm_path) -> dict:
    return Tokenizer.from_gguf_metadata(read_metadata(smollm_path)).to_dict()


def _texts_with_awkward_entries(real: list[str]) -> list[str | None]:
    texts: list[str | None] = list(real[:3000])
    texts[10] = None  # an id without text
    texts[20] = texts[30]  # a duplicate: the later id wins
    texts[40] = ""
    texts[50] = "\ud83d"  # a lone surrogate, as a tokenizer.json may escape one
    texts += ["日本語", "😀", texts[100], None, "Ġthe end"]
    return texts


def test_vocabulary_matches_a_list_and_dict(smollm_spec):
    texts = _texts_with_awkward_entries(smollm_spec["model"]["vocab"])
    vocab = Vocabulary.build(texts)
    restored = Vocabulary(unpack(pack(vocab.parts())))  # as a tokenizer keeps it
    id_of = {text: index for index, text in enumerate(texts) if text is not None}
    for built in (vocab, restored):
        assert len(built) == len(texts) and built.to_list() == texts
        for text, token_id in id_of.items():
            assert built.find(text) == token_id, text
            assert list(built.find_all(text)) == sorted(
                (index for index, other in enumerate(texts) if other == text), reverse=True)
        for absent in ("not a token at all", "Ġthe end!", "\ud83e", "日本", "x" * 100):
            assert built.find(absent) is None and absent not in built


def test_merge_table_matches_a_dict(smollm_spec):
    rng = np.random.default_rng(0)
    size = len(smollm_spec["model"]["vocab"])
    lefts, rights, merged = (rng.integers(0, 300, 5000), rng.integers(0, 300, 5000), rng.integers(0, size, 5000))
    expected = {}
    for rank, (left, right, made) in enumerate(zip(lefts.tolist(), rights.tolist(), merged.tolist())):
        expected[(left, right)] = (rank, made)  # a repeated pair keeps its last rank
    assert len(expected) < 5000, "the random pairs should repeat some"
    table = MergeTable.build(lefts, rights, merged, size)
    table = MergeTable(unpack(pack(table.parts())), size)
    assert len(table) == len(expected)
    for left in range(300):
        for right in range(300):
            assert table.get(left, right) == expected.get((left, right))
    by_rank = sorted(expected, key=lambda pair: expected[pair][0])
    assert [list(ids) for ids in zip(*table.pairs_in_rank_order())] == [list(pair) for pair in by_rank]


def test_ids_and_texts_match_the_plain_definition(smollm_spec):
    spec = dict(smollm_spec)
    vocab = list(spec["model"]["vocab"])
    gone = {vocab[500], vocab[600]}
    vocab[500] = None  # an id without text
    vocab[600] = vocab[700]  # a duplicate text
    merges = [[left, right] for left, right in spec["model"]["merges"] if not {left, right, left + right} & gone]
    spec["model"] = {**spec["model"], "vocab": vocab, "merges": merges}
    spec["normalizer"] = {"type": "Lowercase"}
    size = len(vocab)
    spec["added_tokens"] = spec["added_tokens"] + [
        {"id": size + 2, "content": "<beyond>", "special": True},  # past the vocabulary, leaving a gap
        {"id": 800, "content": "MiXeD", "normalized": True},  # decodes as its normalized text
        {"id": 900, "content": vocab[901], "special": True},  # takes another token's text
    ]
    tok = Tokenizer.from_dict(spec)

    # The definition the compact form replaces: a list of texts and a dict, later ids winning.
    texts = vocab + [None] * 3
    for entry in spec["added_tokens"]:
        texts[entry["id"]] = entry["content"]
    texts[800] = "mixed"
    id_of = {text: index for index, text in enumerate(texts) if text is not None}

    assert tok.vocab_size == len(texts)
    assert [tok.id_to_token(index) for index in range(len(texts))] == texts
    for text, token_id in id_of.items():
        assert tok.token_to_id(text) == token_id, text
    assert tok.token_to_id(vocab[800]) is None and tok.token_to_id(vocab[900]) is None
    assert tok.is_special(size + 2) and tok.is_special(900) and not tok.is_special(800)
    assert tok.token_bytes(500) == b"" and tok.decode([500, size + 1]) == ""
    assert tok.encode("a MIXED b", add_bos=False).count(800) == 1
    with pytest.raises(ValueError, match="outside the vocabulary"):
        tok.id_to_token(len(texts))
    assert Tokenizer.from_dict(tok.to_dict()).encode(heldout_text()[:2000]) == tok.encode(heldout_text()[:2000])


def test_threads_assembling_at_once_agree(smollm_path):
    meta = read_metadata(smollm_path)
    texts = [heldout_text()[start:start + 400] for start in range(0, 4000, 400)]
    expected = [Tokenizer.from_gguf_metadata(meta).encode(text) for text in texts]
    tok = Tokenizer.from_gguf_metadata(meta)  # not assembled until first used
    results: dict[int, list[list[int]]] = {}
    start = threading.Barrier(len(texts))

    def run(index: int) -> None:
        start.wait()
        results[index] = [tok.encode(text) for text in texts]

    threads = [threading.Thread(target=run, args=(index,)) for index in range(len(texts))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert [results[index] for index in range(len(texts))] == [expected] * len(texts)
