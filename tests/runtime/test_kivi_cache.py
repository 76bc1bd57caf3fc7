"""The kivi2 KV cache in the native engine: planned like the other formats, a fraction of f16's
memory, close to f16 in quality, and the limits it states (no token trees; truncation keeps whole
2-bit blocks)."""

from __future__ import annotations

import edgeflash as ef
import numpy as np
import pytest
from edgeflash.base.errors import UserError
from edgeflash.kernels import KIVI, kivi_recent
from edgeflash.export.corpus import heldout_text
from edgeflash.runtime.native_config import default_context, kv_cache_bytes

MODEL = "smollm2-135m"


@pytest.fixture(scope="module")
def model():
    return ef.load(MODEL, context_length=2048, kv_cache="kivi2")


def test_plan_matches_the_engine_and_is_under_0_3x_f16(model):
    spec = model.spec
    stats = model.engine.stats()
    assert stats["kv_cache_format"] == "kivi2"
    assert stats["kv_cache_bytes"] == kv_cache_bytes(spec, 2048, kv_format="kivi2")
    assert stats["kv_cache_bytes"] < 0.3 * kv_cache_bytes(spec, 2048, kv_format="f16")


def test_a_budget_gets_a_longer_default_context_than_with_q8_0():
    spec = ef.load(MODEL, context_length=64).spec
    budget = 40 << 20
    assert default_context(spec, budget, kv_format="kivi2") >= 2 * default_context(spec, budget, kv_format="q8_0")


def _nll(engine, ids: list[int]) -> float:
    engine.reset()
    logits = engine.forward(ids[:-1], all_logits=True).astype(np.float64)
    top = logits.max(axis=1)
    lse = top + np.log(np.exp(logits - top[:, None]).sum(axis=1))
    return float(np.mean(lse - logits[np.arange(len(ids) - 1), ids[1:]]))


def test_quality_stays_close_to_f16(model):
    """Teacher-forced NLL over 1024 held-out tokens (most keys in 2-bit blocks)."""
    ids = model.engine.source.tokenizer.encode(heldout_text()[50_000:60_000])[:1024]
    f16 = ef.load(MODEL, context_length=2048)
    base, kivi = _nll(f16.engine, ids), _nll(model.engine, ids)
    assert kivi - base < 0.1, (base, kivi)  # perplexity within 10.5%


def test_truncation_keeps_whole_blocks(model):
    engine = model.engine
    ids = engine.source.tokenizer.encode(heldout_text()[80_000:90_000])[:600]
    assert len(ids) == 600
    engine.reset()
    engine.forward(ids)
    # Runs of 32, the last starting at 576, sealed the blocks ending R+ positions before it.
    G, R = KIVI["group"], kivi_recent(2048)
    sealed = ((576 - 1 - (G - 1) - R) // G + 1) * G
    assert 2 * G < sealed < 590
    engine.truncate(sealed + 10)
    assert len(engine.tokens) == sealed + 10  # the cut is past the 2-bit blocks: kept as asked
    engine.truncate(sealed - G + 8)
    assert len(engine.tokens) == sealed - G  # inside the last sealed block: back to its start
    engine.forward(ids[sealed - G:])
    assert len(engine.tokens) == 600


def test_token_trees_are_refused(model):
    with pytest.raises(UserError, match="kivi2"):
        ef.load(MODEL, kv_cache="kivi2", speculative="lookup")
    with pytest.raises(UserError, match="kivi2"):
        model.generate("Once upon a time", max_tokens=4, speculative="lookup")
