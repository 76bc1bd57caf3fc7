"""Speculative decoding is lossless: greedy output equals plain decoding for every drafter on the
real models (also past Gemma's 512-token sliding window), sampling keeps the target's law, and a
budgeted run stays inside its budget with speculation on."""

from __future__ import annotations

import edgeflash as ef
import numpy as np
import pytest
from edgeflash.export.corpus import heldout_windows
from edgeflash.runtime.sampler import Sampler, SamplingParams
from edgeflash.runtime.speculative.controller import Acceptance
from edgeflash.runtime.speculative.decoder import SpeculativeDecoder
from edgeflash.runtime.speculative.drafters import LookupDrafter, ModelDrafter
from edgeflash.runtime.speculative.tree import DraftTree

PASSAGE = heldout_windows(1, chars_per_window=700, offset_chars=150_000)[0]
# The repeat is begun in the prompt: a small model then copies on, whatever it makes of the instruction.
GROUNDED = "Repeat this passage word for word.\n\n" + PASSAGE + "\n\nThe passage again:\n\n" + PASSAGE[:80]
STORY = "Once upon a time, in a small village by the sea,"


@pytest.fixture(scope="module")
def plain_greedy():
    """plain_greedy(bundle, prompt): the bundle's 48 greedy tokens without speculation, decoded
    once for every drafter compared with them."""
    cache: dict = {}

    def tokens(bundle, prompt: str) -> list[int]:
        if (bundle, prompt) not in cache:
            cache[bundle, prompt] = ef.load(bundle).generate(prompt, max_tokens=48, speculative="none").tokens
        return cache[bundle, prompt]

    return tokens


@pytest.mark.parametrize("bundle_fixture", ["smol_bundle", "gemma_bundle"])
@pytest.mark.parametrize("drafter", ["lookup", "self", "auto"])
def test_greedy_equals_plain_decoding(bundle_fixture, drafter, plain_greedy, request):
    bundle = request.getfixturevalue(bundle_fixture)
    m = ef.load(bundle)
    for prompt in (GROUNDED, STORY):
        spec = m.generate(prompt, max_tokens=48, speculative=drafter)
        assert spec.tokens == plain_greedy(bundle, prompt), (drafter, prompt[:30])
        assert spec.stats["spec_passes"] + spec.stats["spec_plain_steps"] > 0


def test_a_generation_drafts_no_deeper_than_the_tokens_it_still_asks_for(smol_bundle, smollm_path):
    """A pass adds its own token after the accepted ones, so with three tokens left a draft goes two
    deep at most, even where passes cost nothing and the draft model (the bundle's own GGUF)
    would otherwise chain as deep as a tree holds; the output is plain decoding's."""
    m = ef.load(smol_bundle)
    kind = f"draft:{smollm_path}"
    plain = m.generate(STORY, max_tokens=4, speculative="none")
    _free_passes(m._drafter(kind), greedy=True)
    spec = m.generate(STORY, max_tokens=4, speculative=kind)
    assert spec.tokens == plain.tokens
    draft = spec.stats["spec_by_drafter"]["draft"]
    # two deep: the top choice at depth 1, and one under each node of depth 1 the second level forwarded
    assert draft["passes"] >= 1 and draft["verified"] <= (1 + ModelDrafter.LEVEL_WIDTH) * draft["passes"], draft


@pytest.mark.parametrize("bundle_fixture", ["smol_bundle", "gemma_bundle"])
def test_lookup_proposes_the_copied_passage(bundle_fixture, plain_greedy, request):
    """Whether a pass drafts at all is the controller's timing call; what lookup proposes is not:
    along the greedy output, its first guess is the next token for most of the copied passage."""
    bundle = request.getfixturevalue(bundle_fixture)
    m = ef.load(bundle)
    answer = plain_greedy(bundle, GROUNDED)
    context = m.encode(GROUNDED) + list(answer)
    start = len(context) - len(answer)
    drafter, right = LookupDrafter(), 0
    for i in range(start, len(context)):
        tree = drafter.propose(context[:i], max_nodes=2, max_depth=1)
        right += len(tree.tokens) > 1 and tree.tokens[1] == context[i]
    assert right >= 10, right  # of 48 tokens: the passage is there to be copied


def test_an_older_occurrence_that_went_on_otherwise_is_an_alternative():
    """The most recent occurrence of the n-gram gives the first branch; an older one followed by a
    different token is an alternative (scored apart, less likely); deeper tokens keep the n-gram."""
    history = [5, 6, 7, 1, 5, 6, 8, 2, 5, 6]
    tree = LookupDrafter().propose(history, max_nodes=16, max_depth=2)
    firsts = {tree.tokens[i]: tree.scores[i] for i in tree.children(0)}
    assert firsts == {8: 2.0, 7: Acceptance.LOOKUP_ALTERNATIVE}
    second = tree.children(tree.child(0, 7))
    assert [tree.tokens[i] for i in second] == [1] and tree.scores[second[0]] == 2.0


def test_draft_model_with_the_same_tokenizer(smol_bundle, smollm_path, gemma_bundle):
    """draft:PATH: a separate model drafts greedily; here the GGUF the bundle was exported from,
    so its drafts are mostly accepted (a drafter as dear as the target drafts only now and then:
    the controller measures that its forwards cost what the target's steps do). A model with
    another tokenizer is refused."""
    m = ef.load(smol_bundle)
    plain = m.generate(STORY, max_tokens=48, speculative="none")
    spec = m.generate(STORY, max_tokens=48, speculative=f"draft:{smollm_path}")
    assert spec.tokens == plain.tokens
    draft = spec.stats["spec_by_drafter"]["draft"]
    assert draft["passes"] > 0 and draft["accepted"] >= 0.5 * draft["passes"]
    with pytest.raises(ef.UserError, match="tokenizer"):
        m.generate(STORY, max_tokens=4, speculative=f"draft:{gemma_bundle}")


def test_a_draft_model_lays_out_its_layers_but_not_a_head_it_never_reads(smol_bundle, smollm_path):
    """A draft model computes its logits over the shortlist only: its tied embedding stays the
    embedding, read in place as the file holds it, and is neither converted nor copied into a full
    head's panel layout (30 MB on SmolLM2-135M, 94 MB on Qwen2.5-Coder-0.5B). Its layers are
    converted to DRAFT_REQUANTIZE and laid out."""
    from edgeflash.runtime.speculative.draft_model import DRAFT_REQUANTIZE, model_drafter

    m = ef.load(smol_bundle)
    drafter = model_drafter(smollm_path, m.engine)
    source = drafter.engine.source
    assert source.spec.tied_embeddings
    assert "token_embd.weight" not in drafter.engine.conversions
    assert drafter.engine.conversions and all(how.endswith(DRAFT_REQUANTIZE)
                                              for how in drafter.engine.conversions.values())
    layer_bytes = sum(t.nbytes for name, t in source.tensors.items() if name.startswith("blk."))
    assert 0 < drafter.engine.stats()["laid_out_bytes"] <= layer_bytes


def test_a_draft_model_drafts_a_tree_and_keeps_what_the_target_accepted(smol_bundle, smollm_path):
    """Where drafting costs nothing, the draft model forwards two nodes a level (its top choice and
    the runner-up, in one batch), and the next step keeps the drafted nodes the target accepted in
    the draft cache instead of forwarding them again."""
    from edgeflash.runtime.speculative.controller import Controller, CostModel
    from edgeflash.runtime.speculative.draft_model import model_drafter

    m = ef.load(smol_bundle)
    drafter = model_drafter(smollm_path, m.engine)
    costs = _free_costs(CostModel())
    c = Controller(16, costs, Acceptance())
    c.acceptance.model_recent["draft"] = 0.9
    prompt = m.encode(STORY)
    tree = DraftTree.root(prompt[-1])
    assert drafter.extend(tree, prompt, c, max_depth=4)
    engine = drafter.engine
    assert engine._engine.tree_size == len(drafter._drafted) > 3  # three levels after the first, wider than a chain
    assert max(tree.depth) == 4
    chain, node = [], len(drafter._drafted) - 1
    while node >= 0:  # the path to the last node forwarded: one a level
        token, node = drafter._drafted[node]
        chain.insert(0, token)
    assert len(chain) == 3
    drafter._keep_drafted(drafter._view(prompt + chain))  # the target took two; the third is the new root
    assert engine.tokens == drafter._view(prompt + chain)[:-1] and engine._engine.tree_size == 0


def test_a_draft_model_drafts_on_past_leaves_no_pass_would_verify(smol_bundle, smollm_path):
    """The runner-up leaves a draft model adds are not worth verifying when the target never accepts
    them; they do not count against the nodes a pass verifies, so the draft goes on down its top
    choices until those fill a pass (here 6 nodes: the root and 5 levels), though the tree then holds
    more nodes than a pass takes."""
    from edgeflash.runtime.speculative.controller import RUNNER_UP, Controller, CostModel
    from edgeflash.runtime.speculative.draft_model import model_drafter

    m = ef.load(smol_bundle)
    drafter = model_drafter(smollm_path, m.engine)
    costs = _free_costs(CostModel())
    acceptance = Acceptance()
    acceptance._table("draft")[:] = (95.0, 100.0)  # its top choices: nearly always accepted
    acceptance._table("draft" + RUNNER_UP)[:] = (0.0, 100.0)  # its runner-ups: never
    c = Controller(6, costs, acceptance)
    prompt = m.encode(STORY)
    tree = DraftTree.root(prompt[-1])
    assert drafter.extend(tree, prompt, c, max_depth=8)
    assert max(tree.depth) == 5 and tree.size > c.max_nodes
    selection = c.select(tree)
    assert len(selection.nodes) == c.max_nodes
    assert all(tree.origins[i] == "draft" for i in selection.nodes[1:])  # the chain of top choices


def test_a_budgeted_draft_model_lays_out_its_resident_layers_in_place(smol_bundle, smollm_path):
    """Under a budget a draft model's resident layer matrices are laid out in panels in the buffers
    they were read into (the kernels run a token 2-3x faster from panels than from rows), with no
    copy: no more memory than rows, and the same logits as the same plan kept in rows."""
    from edgeflash.kernels import current_isa
    from edgeflash.runtime.native_engine import NativeEngine
    from edgeflash.runtime.speculative import draft_model as dm

    m = ef.load(smol_bundle)
    source = dm.open_budgeted_draft_model(smollm_path, m.source)
    budget = 1 << 30  # every layer resident
    weights = dm.budgeted_draft_weights(source, m.source, m.engine.context_length, m.engine.kv_format, budget)
    options = dm.draft_options(source, m.engine.context_length, m.engine.kv_format, True)
    laid_out = NativeEngine(source, weights=weights, options=options)
    # a drafter installs its shortlist head; here both engines get the file's full head, in rows
    head = {name: source.tensors[name] for name in [dm.head_tensor_name(source)]}
    laid_out.set_tensors(head)
    stats = laid_out.stats()
    # llama's q and k rows, reordered when the GGUF was opened, are the source's own: kept in rows
    pinned = set(source.info.get("rewritten_tensors", []))
    read = {n: t.nbytes for n, t in source.tensors.items() if n.startswith("blk.") and len(t.shape) > 1}
    assert stats["laid_out_bytes"] == 0  # nothing copied
    assert stats["laid_out_in_place_bytes"] == sum(b for n, b in read.items() if n not in pinned) > 0
    assert {n for n in weights.resident_tensors if n in read} == pinned
    rows_weights = dm.budgeted_draft_weights(source, m.source, m.engine.context_length, m.engine.kv_format, budget)
    rows_weights.panels = False
    in_rows = NativeEngine(source, weights=rows_weights, options=options)
    in_rows.set_tensors(head)
    assert in_rows.stats()["laid_out_in_place_bytes"] == 0
    ids = m.encode(STORY)[:24]
    a, b = laid_out.forward(ids), in_rows.forward(ids)
    if current_isa() in ("avx2", "avx512"):  # the x86 kernels give rows and panels the same floats
        assert np.array_equal(a, b)
    else:
        np.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-3)


def test_draft_head_rows_are_the_draft_models_and_take_in_the_context(smollm_path):
    from edgeflash.runtime.sources import open_model
    from edgeflash.runtime.speculative.draft_head import DraftHead, shortlist_ids

    source = open_model(smollm_path)
    head = source.tensors["token_embd.weight" if source.spec.tied_embeddings else "output.weight"]
    base = shortlist_ids(source, 1000)
    assert set(source.tokenizer.eos_ids) <= set(base.tolist())
    dh = DraftHead(head, lambda ids: head.take_rows(ids).raw, base, extra=8)
    assert dh.count == len(base)
    assert not dh.add([5, 17])  # already in the shortlist
    assert dh.add([20000, 30000, 20000])
    assert dh.count == len(base) + 2
    assert np.array_equal(dh.rows[dh.count - 2:dh.count], head.take_rows(np.array([20000, 30000])).raw)
    dh.add(range(40000, 40100))  # more than the room left: fills it, no more
    assert dh.count == dh.capacity
    logits = np.full(source.spec.vocab_size, -np.inf, dtype=np.float32)
    logits[dh.ids[:dh.count]] = 0.0
    logits[30000], logits[7] = 3.0, 2.0
    token, p, runner_up, p2 = dh.best_two(logits)
    assert (token, runner_up) == (30000, 7) and p > p2 > 0 and p + p2 < 1
    # a new context's tokens: no room left, so the earlier context's are forgotten first
    assert not dh.has_room([45000, 45001]) and dh.has_room([5, 40000])
    dh.forget_context()
    assert dh.count == len(base) and dh.has_room(range(45000, 45008)) and not dh.has_room(range(45000, 45009))
    assert dh.add([45000, 20000])
    assert dh.ids[dh.count - 2:dh.count].tolist() == [20000, 45000]
    assert np.array_equal(dh.rows[dh.count - 2:dh.count], head.take_rows(np.array([20000, 45000])).raw)
    assert not dh.add([5])  # the shortlist stayed


def test_a_draft_model_head_holds_one_context_at_a_time(smol_bundle, smollm_path):
    """A draft model's head has room for as many context tokens as the context length: when
    earlier prompts' tokens fill it, they are dropped and the current context's taken in again."""
    from edgeflash.runtime.speculative.draft_head import context_rows

    m = ef.load(smol_bundle, context_length=64, speculative=f"draft:{smollm_path}")
    drafters = m._drafters[m.speculative]
    _free_passes(drafters, greedy=True)  # the draft model catches up at once
    head = drafters.model.head
    assert head.capacity - head.base == context_rows(64) == 64
    start = m.encode("Repeat these words:")
    for i in range(4):  # each prompt holds 20 tokens outside the shortlist, its own
        ids = start + list(range(40000 + 20 * i, 40020 + 20 * i))
        m.generate(ids, max_tokens=4)
        outside = set(ids) - set(head.ids[:head.base].tolist())
        assert outside and outside <= set(head.ids[head.base:head.count].tolist())
    assert head.count - head.base <= 64


def test_drafts_shorten_at_the_end_of_the_context(smol_bundle):
    """Speculation runs until the context is full (trees get shallower), and stops where plain
    decoding stops, with the same tokens."""
    prompt = "one two three, " * 40  # an answer that continues the pattern: lookup has a draft every step
    probe = ef.load(smol_bundle)
    context = len(probe.encode(prompt)) + 30
    m = ef.load(smol_bundle, context_length=context)
    plain = m.generate(prompt, max_tokens=64, speculative="none")
    _free_passes(m._drafter("lookup"), greedy=True)  # what is tested is the context's end, not timing
    spec = m.generate(prompt, max_tokens=64, speculative="lookup")
    assert spec.tokens == plain.tokens and plain.finish_reason == spec.finish_reason == "length"
    assert spec.stats["spec_plain_steps"] < len(spec.tokens) // 2  # speculation ran to the end
    assert len(m.engine.tokens) <= context


@pytest.mark.parametrize("cached", [8, 50, 120])
def test_branching_tree_scores_every_node_as_plain_decoding_does(smollm_path, cached):
    """Random branching trees (a node's ancestors are not in adjacent cache slots, as they are in
    plain decoding) of at most `tree_room()` nodes, after caches that put the tree near or across a
    64-slot attention chunk: every node's logits equal, bit for bit, those of decoding its path
    token by token."""
    m = ef.load(smollm_path)
    e = m.engine
    ids = m.encode(PASSAGE)
    rng = np.random.default_rng(cached)
    for _ in range(3):
        e.reset()
        e.forward(ids[:cached])
        size = min(int(rng.integers(8, 33)), e.tree_room())
        assert size >= 1
        tree = DraftTree.root(ids[cached])
        for i in range(1, size):
            tree.add(int(rng.integers(0, i)), int(rng.integers(0, 2000)))
        logits = e.forward_tree(tree.tokens, tree.depths(), tree.ancestor_mask()).copy()
        # plain decoding: the cache token by token once, then each node's path after it (the cache
        # cut back to those `cached` tokens between nodes, as rejected drafts are cut back)
        e.reset()
        for t in ids[:cached]:
            e.forward([t])
        for node in range(tree.size):
            e.truncate(cached)
            assert len(e.tokens) == cached
            for t in [tree.tokens[j] for j in tree.path_to(node)]:
                plain = e.forward([t])[-1]
            assert np.array_equal(plain, logits[node]), (cached, node, tree.depths()[node])


def test_greedy_equal_across_the_sliding_window(gemma_path):
    """A prompt longer than Gemma's 512-token window, so verification runs on ring-buffer layers."""
    m = ef.load(gemma_path)
    long_prompt = heldout_windows(1, chars_per_window=2600, offset_chars=30_000)[0]
    ids = m.encode(long_prompt + "\n\n" + long_prompt[:400])
    assert len(ids) > 600
    plain = m.generate(ids, max_tokens=40, speculative="none")
    spec = m.generate(ids, max_tokens=40, speculative="lookup")
    assert spec.tokens == plain.tokens
    assert spec.stats["spec_passes"] > 0


def test_rejection_rule_samples_the_target_distribution():
    """Drafted candidates tried in turn with the residual rule: the emitted token follows p."""
    p = np.array([0.05, 0.4, 0.25, 0.2, 0.1])
    logits = np.log(p).astype(np.float32)

    class Flat:  # a stand-in engine is not needed: _verify_sampled only reads logits
        pass

    decoder = SpeculativeDecoder.__new__(SpeculativeDecoder)
    decoder.sampler = Sampler(SamplingParams(temperature=1.0, seed=3))
    tree = DraftTree.root(0)
    tree.add(0, 1)  # candidates 1 then 3 after the root
    tree.add(0, 3)
    rows = np.stack([logits, logits, logits])
    counts = np.zeros(5)
    trials = 20000
    for _ in range(trials):
        out, _path = decoder._verify_sampled(tree, rows, [0])
        counts[out[0]] += 1
    expected = p * trials
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 18.5  # 4 degrees of freedom, p = 0.001


SAMPLING_PROMPT = "one two three, one two three, one two three, one two"
# Four tokens are sampled and the first three compared: a first pass then drafts two deep (a pass
# adds its own token after the accepted ones, and a generation drafts no deeper than what it still
# asks for), so acceptance after an accepted draft is part of the law under test.
SAMPLING_PARAMS = {"max_tokens": 4, "temperature": 0.8, "top_k": 8}
SAMPLING_COMPARED = 3
SAMPLING_RUNS = 600


def _sampled_histogram(m, kind: str, n: int) -> tuple[dict, int]:
    """({token tuple: count} over seeds 0..n-1 of SAMPLING_PROMPT with `kind`, verification passes)."""
    out: dict = {}
    passes = 0
    for seed in range(n):
        if kind != "none":
            _free_passes(m._drafter(kind))
        r = m.generate(SAMPLING_PROMPT, seed=seed, speculative=kind, **SAMPLING_PARAMS)
        passes += r.stats.get("spec_passes", 0)
        key = tuple(r.tokens[:SAMPLING_COMPARED])
        out[key] = out.get(key, 0) + 1
    return out, passes


@pytest.fixture(scope="module")
def plain_sampling_histogram(smol_bundle) -> dict:
    """The plain-decoding side of the sampling test: the same seeded runs whichever drafter is
    compared with it, so they are sampled once for all of them."""
    return _sampled_histogram(ef.load(smol_bundle), "none", SAMPLING_RUNS)[0]


@pytest.mark.parametrize("drafter", ["lookup", "draft", "auto", "self"])
def test_speculative_sampling_keeps_the_model_distribution(smol_bundle, smollm_path, plain_sampling_histogram,
                                                           drafter):
    """End to end on SmolLM2 at temperature 0.8: the first sampled tokens after a repetitive prompt
    have the same joint distribution with speculation as without (two-sample chi-square over the
    common outcomes). `draft`: the GGUF drafts for the q4_0 bundle (close, not equal), the
    controller told that passes cost nothing so every step drafts: chains with the runner-up of
    each token beside them, so the multi-candidate rule is what keeps the law. `auto`: the same
    draft model beside lookup, so a tree holds lookup branches, the draft chain and runner-ups.
    `self`: the target's first layers with the same shortlist head a draft model has."""
    m = ef.load(smol_bundle)
    kind = {"lookup": "lookup", "draft": f"draft:{smollm_path}", "auto": f"auto:{smollm_path}", "self": "self"}[drafter]
    n = SAMPLING_RUNS
    a = plain_sampling_histogram
    b, drafted = _sampled_histogram(m, kind, n)
    assert drafted >= n // 2  # most generations verified drafts
    keys = [k for k in set(a) | set(b) if a.get(k, 0) + b.get(k, 0) >= 20]
    chi2 = sum((a.get(k, 0) - b.get(k, 0)) ** 2 / (a.get(k, 0) + b.get(k, 0)) for k in keys)
    # two-sample chi-square with len(keys) - 1 degrees of freedom; 0.001 critical values
    critical = {1: 10.8, 2: 13.8, 3: 16.3, 4: 18.5, 5: 20.5, 6: 22.5, 7: 24.3, 8: 26.1, 9: 27.9, 10: 29.6}
    assert len(keys) >= 3
    assert chi2 < critical.get(len(keys) - 1, 3 * len(keys)), (chi2, len(keys))


def _free_costs(costs):
    """`costs` with verification, drafting and catching up costing nothing next to a plain step."""
    costs.plain, costs.verify = 1.0, {w: 1.0 for w in range(2, 65)}
    costs.draft_share = {"draft": 0.0, "self": 0.0}
    costs.catch_up_share = {"draft": 0.0, "self": 0.0}
    return costs


def _free_passes(drafters, greedy: bool = False) -> None:
    """Tell the controller that verification, drafting and catching up cost nothing next to a plain
    step (so a slow moment of a shared machine cannot pause speculation)."""
    costs, acceptance, guards = drafters.state(greedy=greedy)
    guards.clear()  # what real passes taught the guards before
    _free_costs(costs)
    acceptance.lookup[:] = 0.9
    acceptance.model_recent["draft"] = acceptance.model_recent["self"] = 0.9


def test_a_budgeted_sampled_pass_keeps_to_the_logits_rows_it_reserved(smol_bundle):
    """Sampled verification needs each node's whole row of logits: under a budget its tree holds at
    most SAMPLED_TREE_NODES nodes, whose rows the plan reserved; greedy verification keeps its
    wider trees (it needs only each row's argmax)."""
    from edgeflash.runtime.speculative.budget import SAMPLED_TREE_NODES, sampled_rows_bytes

    m = ef.load(smol_bundle, memory_budget="90MB", speculative="lookup")
    assert m.engine.weights.plan.fixed["speculative"] >= sampled_rows_bytes(m.engine.spec)
    drafters = m._drafters["lookup"]
    sampled = SpeculativeDecoder(m.engine, drafters, Sampler(SamplingParams(temperature=0.8, seed=1)))
    penalized = SpeculativeDecoder(m.engine, drafters, Sampler(SamplingParams(repetition_penalty=1.1)))
    greedy = SpeculativeDecoder(m.engine, drafters, Sampler(SamplingParams()))
    assert sampled.controller.max_nodes == penalized.controller.max_nodes == SAMPLED_TREE_NODES
    assert greedy.controller.max_nodes > SAMPLED_TREE_NODES
    unbudgeted = ef.load(smol_bundle)
    free = SpeculativeDecoder(unbudgeted.engine, unbudgeted._drafter("lookup"),
                              Sampler(SamplingParams(temperature=0.8, seed=1)))
    assert free.controller.max_nodes > SAMPLED_TREE_NODES


@pytest.mark.parametrize("budget,options", [
    ("90MB", {"speculative": "auto"}),
    ("90MB", {"speculative": "auto", "temperature": 0.8, "seed": 1}),  # sampled verification
    # 30% of the bundle file, where nearly every weight streams: q8_0 keys and values and a context
    # that holds the prompt and the answer leave room for the lookup drafter (a format-3 bundle holds
    # one copy of the FFN, so a quarter of its file is below what the engine's own buffers take)
    ("small", {"speculative": "lookup", "kv_cache": "q8_0", "context_length": 384}),
])
def test_budgeted_run_with_speculation_stays_inside_the_budget(smol_bundle, budget, options):
    import json
    import subprocess
    import sys
    import textwrap

    if budget == "small":
        budget = int((smol_bundle / "weights.bin").stat().st_size * 0.3)
    sampling = {k: v for k, v in options.items() if k in ("temperature", "seed")}
    options = {k: v for k, v in options.items() if k not in sampling}
    script = textwrap.dedent(f"""
        import json
        import edgeflash as ef
        from edgeflash.base.rss import current_rss_bytes, peak_rss_bytes, reset_peak_rss
        reset_peak_rss(); before = current_rss_bytes()
        m = ef.load({str(smol_bundle)!r}, memory_budget={budget!r}, **{options!r})
        r = m.generate({GROUNDED!r}, max_tokens=48, **{sampling!r})
        plain = m.generate({GROUNDED!r}, max_tokens=48, speculative="none", **{sampling!r})
        print(json.dumps({{"peak": peak_rss_bytes() - before, "passes": r.stats["spec_passes"],
                          "budget": m.engine.weights.budget, "same": r.tokens == plain.tokens}}))
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    print(options, out)
    assert out["peak"] <= out["budget"]
    assert out["passes"] > 0
    assert out["same"] or sampling  # a sampled answer keeps plain decoding's law, not its draws
