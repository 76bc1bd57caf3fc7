"""The Android app's plain-Kotlin logic (apps/android/llm), compiled with kotlinc and run on the
JVM, against its Python twins on the same inputs:

- the manifest reader agrees with export/targets/chunks.py on manifests the exporter's own
  manifest code writes (SmolLM2 with kv=io, Gemma 3 with kv=state);
- the tokenizer gives the ids of runtime/tokenizer on the real SmolLM2 and Gemma 3 vocabularies;
- the sampler's distributions after greedy / temperature / top-k / top-p / min-p / repetition
  penalty equal runtime/sampler.py's on the same logits;
- chunk scheduling fits the budget, refuses below the minimum and streams least when it must;
- the chain (prefill pieces, decode, KV writes, rewind) makes the same calls and holds the same
  caches as export/targets/runner.py. No ExecuTorch runtime runs on a JVM, so both sides call
  the same formula-defined chunk program (see SyntheticChunk.kt and `FormulaSession` below);
- ChunkedLlm, the model object the app's chat screen holds, opens an export under a budget that
  streams chunks and answers a two-turn chat with the same prompts, calls, reused prefix and
  reply text as the Python runner, tokenizer and sampler.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from android_check import run_check
from target_exports import write_export

CHAT_TEXTS = [
    "Hello world!  How are you?\n\nI'm fine, 1234 thanks.",
    "<|im_start|>user\nWhat's the capital of France?<|im_end|>\n<start_of_turn>model\n",
    "Ünïcödé: héllo wörld, 日本語のテキスト, emoji 😀🎉 and tabs\tand   spaces  ",
    "def f(x):\n    return x**2  # squares\n",
    "  leading spaces, trailing newline\n",
    "a",
]


class FormulaSession:
    """The chunk program of SyntheticChunk.kt, in numpy float32 with the same operation order."""

    def __init__(self, runner, chunk: dict, trace: list):
        self.runner, self.chunk, self.trace = runner, chunk, trace

    def run(self, method: str, inputs: list[np.ndarray]) -> list[np.ndarray]:
        f32 = np.float32
        spec, chunk = self.runner.spec, self.chunk
        x, pos = inputs[0], inputs[1]
        width, d = len(pos), spec.d_model
        rest = inputs[2:]
        last = -1
        if chunk["head"]:
            last, rest = int(rest[0][0]), rest[1:]
        self.trace.append([self.runner.chunks.index(chunk), method, int(pos[0]), width, last])
        if chunk["embedding"]:
            hidden = x.astype(f32)[:, None] * f32(0.001) + np.arange(d, dtype=f32)[None, :] * f32(0.01)
        else:
            hidden = x.astype(f32) + f32(1.0)
        fresh = []
        layers = list(range(*chunk["layers"]))
        heads, length, head_dim = self.runner.manifest["cache"]["shape"]
        for j, layer in enumerate(layers):
            for kind in (0, 1):
                cache = rest[2 * j + kind]
                prev = np.zeros((heads, width, head_dim), f32)
                for t, p in enumerate(pos):
                    if 0 < p <= length:
                        prev[:, t] = cache[:, p - 1]
                base = (pos.astype(f32)[None, :, None] + f32(layer * 10.0) + f32(kind * 5.0)
                        + np.arange(heads, dtype=f32)[:, None, None])
                out = (base + np.arange(head_dim, dtype=f32)[None, None, :] * f32(0.01)) + prev * f32(0.5)
                fresh.append(out.astype(f32))
                hidden[:, 0] += out[0, :, 0] * f32(0.001)
        if chunk["head"]:
            v = np.arange(spec.vocab_size)
            first = hidden[last, v % d] + v.astype(f32) * f32(1e-4)
            first = first.reshape(1, -1).astype(f32)
        else:
            first = hidden
        return [first, *fresh]


@pytest.fixture(scope="module")
def exports(tmp_path_factory, smollm_path, gemma_path):
    from edgeflash.export.sources import load_source

    root = tmp_path_factory.mktemp("android")
    smol, gemma = load_source(str(smollm_path)), load_source(str(gemma_path))
    return SimpleNamespace(
        root=root,
        smol=write_export(root / "smol-et", smol, "executorch", "io", 3, 40, 8),
        gemma=write_export(root / "gemma-cm", gemma, "coreml", "state", 2, 64, 16),
        smol_tok=smol.tokenizer, gemma_tok=gemma.tokenizer)


CASES = [
    {"temperature": 0.0},
    {"temperature": 0.0, "repetition_penalty": 1.3},
    {"temperature": 0.7},
    {"temperature": 1.0, "top_k": 40},
    {"temperature": 0.8, "top_p": 0.9},
    {"temperature": 1.2, "top_k": 100, "top_p": 0.5, "min_p": 0.05},
    {"temperature": 0.9, "min_p": 0.1, "repetition_penalty": 1.2},
    {"temperature": 0.5, "top_k": 1},
]
CHAT_TURNS = ["Hi!", "And again?"]
CHAT_MAX_TOKENS = 5
CHAT_BUDGET = 90 * 2**20  # streams at least one SmolLM2 chunk (asserted below)
CHAIN_STEPS = [{"feed": list(range(100, 119))}, {"feed": [7]}, {"feed": [8, 9]}, {"rewind": 10, "feed": [5, 6, 7]},
               {"feed": list(range(200, 212))}]


@pytest.fixture(scope="module")
def kotlin(exports):
    """One JVM run of every check; the request also holds what the Python side needs."""
    rng = np.random.default_rng(0)
    vocab = 49152
    rows = [rng.standard_normal(vocab).astype(np.float32) * 3,  # broad
            (rng.standard_normal(vocab) * 8).astype(np.float32)]  # peaked
    rows[1][123] = rows[1].max() + 0.5
    rows.append(np.round(rng.standard_normal(vocab), 1).astype(np.float32))  # many ties
    paths = []
    for i, row in enumerate(rows):
        p = exports.root / f"logits{i}.f32"
        row.astype("<f4").tofile(p)
        paths.append(str(p))
    history = [int(i) for i in np.argsort(-rows[0])[:5]] + [123, 7, 7]
    cases = [{"row": r, "params": params, "history": history if "repetition_penalty" in params else []}
             for r in range(len(rows)) for params in CASES]
    smol_manifest = exports.smol / "manifest.json"
    from edgeflash.export.targets.chunks import read_manifest
    from edgeflash.export.targets.runner import TargetRunner  # noqa: F401  (fails early if the runner moved)

    smol_m = read_manifest(exports.smol)
    total = sum(c["bytes"] for c in smol_m["chunks"])
    budgets = [10**6, 60 * 2**20, 90 * 2**20, 120 * 2**20, 200 * 2**20, 10**10]
    request = {
        "out": str(exports.root / "kt-out"),
        "manifests": [str(smol_manifest), str(exports.gemma / "manifest.json")],
        "tokenizers": [{"path": str(exports.smol / "tokenizer.json"), "texts": CHAT_TEXTS},
                       {"path": str(exports.gemma / "tokenizer.json"), "texts": CHAT_TEXTS}],
        "sampling": {"logits": paths, "cases": cases},
        "schedules": [{"manifest": str(smol_manifest), "budgets": budgets, "tokenizer_bytes": 3 * 2**20},
                      {"manifest": str(exports.gemma / "manifest.json"), "budgets": budgets, "tokenizer_bytes": 0}],
        "chain": {"manifest": str(smol_manifest), "budget": 10**10, "steps": CHAIN_STEPS},
        "chat": {"dir": str(exports.smol), "budget": CHAT_BUDGET, "turns": CHAT_TURNS, "max_tokens": CHAT_MAX_TOKENS},
        "selfcheck": True,
    }
    result = run_check(request, exports.root)
    return SimpleNamespace(result=result, rows=rows, cases=cases, total=total, budgets=budgets)


def test_manifest_reader_agrees_with_python(exports, kotlin):
    from edgeflash.export.targets.chunks import read_manifest

    assert len(kotlin.result["manifests"]) == 2
    for got, folder in zip(kotlin.result["manifests"], (exports.smol, exports.gemma)):
        m = read_manifest(folder)
        spec = m["model"]["spec"]
        assert "error" not in got, got
        assert got["target"] == m["target"]
        assert (got["n_layers"], got["d_model"], got["vocab_size"]) == (spec["n_layers"], spec["d_model"], spec["vocab_size"])
        assert got["cache"] == {k: m["cache"][k] for k in ("mode", "length", "shape", "windows")}
        assert got["prefill_tokens"] == m["methods"]["prefill"]["tokens"]
        assert (got["bos_id"], got["eos_ids"]) == (m["tokenizer"]["bos_id"], m["tokenizer"]["eos_ids"])
        assert got["total_bytes"] == m["total_bytes"]
        assert len(got["chunks"]) == len(m["chunks"])
        for kc, pc in zip(got["chunks"], m["chunks"]):
            assert (kc["file"], kc["layers"], kc["embedding"], kc["head"], kc["bytes"]) == \
                   (pc["file"], pc["layers"], pc["embedding"], pc["head"], pc["bytes"])
            for side, key in ((kc["inputs"], "inputs"), (kc["outputs"], "outputs")):
                assert side == [[t["name"], t["dtype"], [-1 if d == "T" else d for d in t["shape"]]] for t in pc[key]]


def test_tokenizer_matches_python(exports, kotlin):
    smol, gemma = kotlin.result["tokenizers"]
    for got, tok in ((smol, exports.smol_tok), (gemma, exports.gemma_tok)):
        assert got["encoded"] == [tok.encode(t) for t in CHAT_TEXTS]
        assert got["plain"] == [tok.encode(t, parse_special=False) for t in CHAT_TEXTS]
        assert got["decoded"] == [tok.decode(tok.encode(t)) for t in CHAT_TEXTS]
        assert got["streamed"] == got["decoded"]
        assert got["bos_id"] == tok.bos_id and got["eos_ids"] == sorted(tok.eos_ids)
        assert got["vocab_size"] == tok.vocab_size
    # The turn formats the chat screen writes, as the Python chat renderer writes them.
    from edgeflash.runtime.tokenizer.chat import _render_chatml, _render_gemma

    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+2?"},
            {"role": "assistant", "content": "4."}, {"role": "user", "content": "And 3+3?"}]
    assert (smol["chat_format"], gemma["chat_format"]) == ("chatml", "gemma")
    assert smol["chat_text"] == _render_chatml(chat, True)
    assert gemma["chat_text"] == _render_gemma(chat, True)
    assert gemma["chat_ids"] == exports.gemma_tok.encode(_render_gemma(chat, True))
    assert gemma["chat_ids"][0] == exports.gemma_tok.bos_id


def test_sampler_matches_python(kotlin):
    from edgeflash.runtime.sampler import Sampler, SamplingParams

    assert len(kotlin.result["sampling"]) == len(kotlin.cases)
    for case, got in zip(kotlin.cases, kotlin.result["sampling"]):
        logits = kotlin.rows[case["row"]]
        sampler = Sampler(SamplingParams(**case["params"]))
        want = sampler.probabilities(logits, case["history"])
        probs = np.fromfile(got["probs"], dtype="<f8")
        assert np.array_equal(probs > 0, want > 0), (case, int((probs > 0).sum()), int((want > 0).sum()))
        np.testing.assert_allclose(probs, want, rtol=1e-6, atol=1e-12, err_msg=str(case))
        if sampler.params.greedy:
            assert got["pick"] == sampler(logits, case["history"])
        assert all(want[d] > 0 for d in got["draws"]), case
        if int((want > 0).sum()) > 3:
            assert len(set(got["draws"])) > 1, case  # it samples, not always the top token


def test_schedule_respects_the_budget(kotlin):
    smol, gemma = kotlin.result["schedules"]
    for sched, mode in ((smol, "io"), (gemma, "state")):
        sizes, fixed, minimum = sched["chunk_bytes"], sched["fixed"], sched["minimum"]
        assert minimum == fixed + (max(sizes) if mode == "io" else sum(sizes))
        loaded = []
        for budget, plan in zip(kotlin.budgets, sched["plans"]):
            if budget < minimum:
                assert "too small" in plan["error"] and f"{minimum / 2**20:.1f} MiB" in plan["error"], plan
                continue
            assert "error" not in plan, plan
            assert sorted(plan["resident"] + plan["streamed"]) == list(range(len(sizes)))
            streamed = [sizes[i] for i in plan["streamed"]]
            peak = fixed + sum(sizes[i] for i in plan["resident"]) + max(streamed, default=0)
            assert plan["peak"] == peak <= budget
            assert plan["loaded_per_pass"] == sum(streamed)
            if mode == "state":
                assert plan["streamed"] == []
            loaded.append(plan["loaded_per_pass"])
        assert loaded == sorted(loaded, reverse=True)  # more budget never streams more
        assert loaded[-1] == 0
    # The SmolLM2 budgets cover all three regimes: refused, streaming, all resident.
    smol_plans = smol["plans"]
    assert "error" in smol_plans[0] and any(p.get("streamed") for p in smol_plans) and smol_plans[-1]["streamed"] == []


def test_chain_matches_the_python_runner(exports, kotlin):
    from edgeflash.export.targets.runner import TargetRunner

    trace: list = []

    class Runner(TargetRunner):
        def _session(self, i):
            return FormulaSession(self, self.chunks[i], trace)

    runner = Runner(exports.smol, resident=False)
    got = kotlin.result["chain"]
    assert len(got["logits"]) == len(CHAIN_STEPS)
    for step, path in zip(CHAIN_STEPS, got["logits"]):
        if "rewind" in step:
            runner.pos = step["rewind"]
        want = runner.feed(step["feed"])
        np.testing.assert_allclose(np.fromfile(path, dtype="<f4"), want, rtol=1e-5, atol=1e-4)
    assert got["trace"] == trace
    assert {t[1] for t in trace} == {"prefill", "decode"}
    assert got["pos"] == runner.pos
    caches = iter(got["caches"])
    for layer in range(runner.spec.n_layers):
        for kind, want in zip("kv", runner.caches[layer]):
            kc = np.fromfile(next(caches), dtype="<f4").reshape(want.shape)
            np.testing.assert_allclose(kc[:, :runner.pos], want[:, :runner.pos], rtol=1e-5, atol=1e-4,
                                       err_msg=f"{kind} cache of layer {layer}")


def python_chat(runner, tok, turns: list[str], max_tokens: int) -> list[dict]:
    """What Generator.kt does for each turn, with the Python runner, chat renderer and sampler."""
    from edgeflash.runtime.sampler import Sampler, SamplingParams
    from edgeflash.runtime.tokenizer.chat import _render_chatml

    greedy = Sampler(SamplingParams(temperature=0.0))
    cache_len = runner.manifest["cache"]["length"]
    messages: list[dict] = []
    fed: list[int] = []  # the ids whose entries the cache holds
    replies = []
    for text in turns:
        messages.append({"role": "user", "content": text})
        prompt = tok.encode(_render_chatml(messages, True))
        keep = 0
        while keep < min(len(fed), len(prompt) - 1) and fed[keep] == prompt[keep]:
            keep += 1
        runner.pos, fed = keep, fed[:keep]
        logits = runner.feed(prompt[keep:])
        fed += prompt[keep:]
        history, out, reason = list(prompt), [], "length"
        while True:
            token = greedy(logits, history)
            out.append(token)
            history.append(token)
            if token in tok.eos_ids:
                reason = "stop"
                break
            if len(out) >= max_tokens:
                break
            if runner.pos >= cache_len:
                reason = "context"
                break
            logits = runner.feed([token])
            fed.append(token)
        reply = tok.decode([t for t in out if t not in tok.eos_ids])
        messages.append({"role": "assistant", "content": reply.strip()})
        replies.append({"text": reply, "prompt_tokens": len(prompt), "reused": keep, "generated": len(out), "stop": reason})
    return replies


def test_chunked_llm_chat_matches_the_python_runner(exports, kotlin):
    from edgeflash.export.targets.runner import TargetRunner

    got = kotlin.result["chat"]
    # The app's refusals: an export for another runtime, and a budget below the minimum.
    wrong_target, too_small = got["refused"]
    assert "target is executorch; this app runs coreml exports" in wrong_target
    assert too_small is not None and "too small" in too_small
    # The budget streams chunks: each pass loads every streamed chunk again.
    assert got["streamed"], got
    assert got["loads"] == len(got["resident"]) + len(got["streamed"]) * got["passes"]

    trace: list = []

    class Runner(TargetRunner):
        def _session(self, i):
            return FormulaSession(self, self.chunks[i], trace)

    want = python_chat(Runner(exports.smol, resident=False), exports.smol_tok, CHAT_TURNS, CHAT_MAX_TOKENS)
    assert len(got["turns"]) == len(want) == 2
    for kt, py in zip(got["turns"], want):
        assert "".join(kt["pieces"]) == py["text"]
        assert (kt["prompt_tokens"], kt["reused"], kt["generated"], kt["stop"]) == \
               (py["prompt_tokens"], py["reused"], py["generated"], py["stop"])
    assert want[1]["reused"] > 0  # the second turn reuses the first turn's cache
    assert got["trace"] == trace
    assert got["passes"] == sum(1 for t in trace if t[0] == 0)  # every pass starts at chunk 0


def test_kotlin_self_checks(kotlin):
    failed = {name: why for name, why in kotlin.result["selfcheck"].items() if why is not None}
    assert not failed
    assert len(kotlin.result["selfcheck"]) >= 6
