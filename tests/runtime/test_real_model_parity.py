"""The numpy reference runtime against transformers on the two real GGUF models.

For each prompt (a short one, a chat-formatted one, and one longer than 600 tokens, which crosses
Gemma 3's 512-token sliding window): identical prompt token ids, teacher-forced logits within
LOGIT_ATOL of transformers' fp32 model built from the same GGUF, identical 32-token greedy text.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="transformers is the oracle; install edgeflash[test]")

from edgeflash.export.corpus import heldout_windows  # noqa: E402
from edgeflash.runtime.generate import Generation  # noqa: E402
from edgeflash.runtime.reference import ReferenceEngine  # noqa: E402
from edgeflash.runtime.sampler import SamplingParams  # noqa: E402
from edgeflash.runtime.sources import open_model  # noqa: E402
from edgeflash.runtime.tokenizer import render_chat  # noqa: E402
from hf_reference import transformers_reference  # noqa: E402

# Both runtimes compute in fp32 from identically dequantized weights; the remaining difference is
# summation order. Measured maxima: 3e-5 to 5.5e-4 (888-token Gemma prompt); logits span about +-30.
LOGIT_ATOL = 2e-3


def _prompts(tokenizer) -> dict[str, str]:
    chat = render_chat(tokenizer, [{"role": "user", "content": "Give me two tips for writing clear emails."}])
    return {
        "short": "The capital of France is Paris, and the capital of Germany is",
        "chat": chat,
        "long": heldout_windows(1, chars_per_window=3200)[0],
    }


@pytest.fixture(scope="module", params=["gemma3-270m", "smollm2-135m"])
def pair(request, model_path):
    path = model_path(request.param)
    tok, model = transformers_reference(path)
    return request.param, open_model(path), tok, model


@pytest.mark.slow
@pytest.mark.parametrize("prompt_kind", ["short", "chat", "long"])
def test_matches_transformers(pair, prompt_kind):
    alias, source, hf_tok, hf_model = pair
    text = _prompts(source.tokenizer)[prompt_kind]
    ids = source.tokenizer.encode(text)
    assert ids == hf_tok(text)["input_ids"], "prompt token ids differ from transformers' tokenizer"
    if prompt_kind == "long":
        assert len(ids) > 600, len(ids)

    engine = ReferenceEngine(source)
    ours = engine.forward(ids, all_logits=True)  # [T, vocab]
    with torch.no_grad():
        theirs = hf_model(torch.tensor([ids])).logits[0].numpy()
    err = float(np.abs(ours - theirs).max())
    print(f"{alias}/{prompt_kind}: {len(ids)} tokens, max |logit diff| = {err:.2e}")
    assert err <= LOGIT_ATOL

    # The engine holds the prompt from the teacher-forced pass (the same forward as a fresh
    # prefill, whose every row was just compared): the generation keeps it and recomputes only
    # the last prompt token, then decodes from the cache.
    assert engine.tokens == ids
    ours_gen = Generation(engine, ids, 32, SamplingParams()).result().tokens
    with torch.no_grad():
        out = hf_model.generate(torch.tensor([ids]), max_new_tokens=32, do_sample=False)
    theirs_gen = out[0, len(ids):].tolist()
    eos = set(source.tokenizer.eos_ids)
    theirs_gen = theirs_gen[:next((i for i, t in enumerate(theirs_gen) if t in eos), len(theirs_gen))]
    assert ours_gen == theirs_gen


@pytest.mark.slow
def test_smollm2_chat_template_matches_transformers(smollm_path):
    source = open_model(smollm_path)
    hf_tok, _ = transformers_reference(smollm_path)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+2?"},
                {"role": "assistant", "content": "4"}, {"role": "user", "content": "And 3+3?"}]
    ours = render_chat(source.tokenizer, messages, add_generation_prompt=True)
    theirs = hf_tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert ours == theirs
