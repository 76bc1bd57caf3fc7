"""Every family shape, on tiny random models built with transformers and loaded from their
saved safetensors directory: logits for all positions and a cached greedy decode must match."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="transformers is the oracle; install edgeflash[test]")
transformers = pytest.importorskip("transformers")

from edgeflash.runtime.reference import ReferenceEngine  # noqa: E402
from edgeflash.runtime.sources.hf import load_hf_dir  # noqa: E402
from tiny_models import CASES, build_tiny_model, save_tokenizer  # noqa: E402


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory, smollm_path):
    out = tmp_path_factory.mktemp("tokenizer")
    return out, save_tokenizer(smollm_path, out)


@pytest.mark.parametrize("case", list(CASES))
def test_logits_and_cached_decode_match_transformers(case, tokenizer_dir, tmp_path):
    model = build_tiny_model(case, tokenizer_dir[0], tokenizer_dir[1], tmp_path)
    source = load_hf_dir(tmp_path)
    rng = np.random.default_rng(1)
    prompt = rng.integers(0, source.spec.vocab_size, size=20).tolist()  # 20 > sliding window of 8

    engine = ReferenceEngine(source)
    ours = engine.forward(prompt, all_logits=True)
    with torch.no_grad():
        theirs = model(torch.tensor([prompt])).logits[0].numpy()
    scale = np.abs(theirs).max()
    assert np.abs(ours - theirs).max() <= 1e-4 * max(scale, 1.0), case

    # Greedy decode through our KV cache vs. transformers recomputing each prefix from scratch.
    ids = list(prompt)
    logits = ours[-1]
    for _ in range(12):
        nxt = int(np.argmax(logits))
        with torch.no_grad():
            ref_next = int(model(torch.tensor([ids])).logits[0, -1].argmax())
        assert nxt == ref_next, f"{case}: diverged at generated token {len(ids) - len(prompt)}"
        ids.append(nxt)
        logits = engine.forward([nxt])[-1]
