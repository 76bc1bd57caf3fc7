"""The feature drafter: the target's hidden states as the engine hands them out, a drafter trained
on them (export/feature_drafter.py) for a real model, and speculation with it staying lossless."""

from __future__ import annotations

import edgeflash as ef
import numpy as np
import pytest
from edgeflash.runtime.tensors import dequantize_raw


@pytest.fixture(scope="module")
def smol(smollm_path):
    return ef.load(smollm_path, context_length=256)


def test_last_feature_is_what_the_head_multiplied(smol):
    """The hidden state of the last cached token, times the head, gives the logits the engine
    returned for it (up to the Q8 activations the head runs with)."""
    e = smol.engine
    e.reset()
    logits = e.forward(smol.encode("The capital of France is"))[-1]
    feature = e.last_feature()
    head = e.source.tensors["token_embd.weight"]
    expected = dequantize_raw(head.raw, head.fmt, head.cols) @ feature
    assert int(np.argmax(expected)) == int(np.argmax(logits))
    assert np.corrcoef(expected, logits)[0, 1] > 0.999


def test_a_verified_tree_leaves_the_accepted_tokens_feature_as_plain_decoding_does(smol):
    """After a tree pass keeps a path, the last cached token's hidden state is the one plain
    decoding of the same tokens computes (bit for bit: a tree node is scored as plain decoding would
    score it). A rollback forgets it, rather than handing out a stale one."""
    e = smol.engine
    prompt = smol.encode("Once upon a time")
    e.reset()
    e.forward(prompt + [11, 12])
    plain = e.last_feature().copy()
    e.reset()
    e.forward(prompt)
    mask = np.array([[1, 0, 0], [1, 1, 0], [1, 0, 1]], dtype=np.uint8)  # 13 and 12 both follow 11
    e.forward_tree([11, 13, 12], [0, 1, 1], mask, argmax_only=True)
    assert e.last_feature() is None  # nothing is cached after the tree until it is committed
    e.commit_tree([0, 2])
    np.testing.assert_array_equal(e.last_feature(), plain)
    e.truncate(len(prompt))
    assert e.last_feature() is None
