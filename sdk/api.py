"""The Python API: `load` a model, then `generate`, `stream` or `chat` with it."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any, Iterator, Sequence

# Everything a load may need, imported with the package rather than inside `load` (so a
# budgeted load's memory is the model's, not the library's code).
import edgeflash.memory.budgeted  # noqa: F401
import edgeflash.runtime.bundle  # noqa: F401
import edgeflash.runtime.native_engine  # noqa: F401
import edgeflash.runtime.speculative  # noqa: F401
import edgeflash.runtime.tokenizer  # noqa: F401
from edgeflash.base.errors import UserError
from edgeflash.base.heap import keep_large_allocations_mapped, release_free_heap
from edgeflash.base.models import resolve_model
from edgeflash.runtime.generate import Generation, GenerationResult
from edgeflash.runtime.sampler import SamplingParams
from edgeflash.runtime.source import ModelSource
from edgeflash.runtime.sources import open_model

ENGINES = ("auto", "native", "reference")
# Tokens per forward call in a budgeted run: smaller work buffers (prefill runs in more chunks).
BUDGETED_MAX_BATCH = 16


def load(model: str | Path = "default", *, memory_budget: str | int | None = None, threads: int = 2,
         engine: str = "auto", context_length: int | None = None, strategy: str = "flash",
         activations: str = "q8x2", kv_cache: str = "f16", sparsity: float | None = None, window: int = 4,
         head_shortlist: int | None = None, speculative: str = "none") -> Model:
    """Open a GGUF file, a Hugging Face directory, a bundle or a model alias ("default").

    memory_budget: one byte budget ("96MB", "1.5GiB" or bytes) for everything loading and running
    the model allocates; weights that do not fit are read from flash for every token.
    strategy: how a budgeted run streams ("flash", "hybrid" or "naive"; see edgeflash.memory.planner).
    activations: "q8x2" (default, agrees with the reference), "q8" (fastest) or "f32".
    kv_cache: "f16" (default) or "q8_0", which halves the KV cache's memory at a small quality cost.
    sparsity, window, head_shortlist: approximate mode of a budgeted bundle (edgeflash.memory.approximate):
    the FFN reads only predicted-active neurons through a cache of the last `window` tokens' neurons,
    and the head computes only the `head_shortlist` most frequent tokens. Off (exact) by default.
    speculative: "none", "lookup" (n-grams of the context), "self" (the model's first layers and a
    reduced head; needs a bundle), "draft:PATH" (a smaller model with the same tokenizer) or "auto".
    Lossless: greedy output is unchanged and sampling keeps the model's distribution."""
    if engine not in ENGINES:
        raise UserError(f"engine = {engine!r}: expected one of {', '.join(ENGINES)}")
    if threads < 1:
        raise UserError(f"threads = {threads}: expected an integer >= 1")
    if context_length is not None and context_length < 2:
        raise UserError(f"context_length = {context_length}: expected an integer >= 2")
    if activations not in ("q8x2", "q8", "f32"):
        raise UserError(f"activations = {activations!r}: expected q8x2, q8 or f32")
    if kv_cache not in ("f16", "q8_0"):
        raise UserError(f"kv_cache = {kv_cache!r}: expected f16 or q8_0")
    if engine == "reference" and kv_cache != "f16":
        raise UserError("kv_cache = 'q8_0' needs the native engine (the reference runtime keeps its cache in float32)")
    path = resolve_model(model)
    approximate = {"sparsity": sparsity, "window": window, "head_shortlist": head_shortlist}
    if memory_budget is None:
        if sparsity is not None or head_shortlist is not None:
            raise UserError("sparsity and head_shortlist are modes of a budgeted run: give memory_budget too")
        source = open_model(path)
        model = Model(source, _make_engine(source, engine, threads, context_length, activations, kv_cache))
    else:
        model = Model(*_load_budgeted(path, memory_budget, engine, threads, context_length, strategy, activations,
                                      kv_cache, approximate, speculative))
    model.speculative = model.check_speculative(speculative)
    if memory_budget is not None and speculative != "none":
        model.engine.check_reserve("speculative", model.drafter_bytes(speculative))
    return model


def _make_engine(source: ModelSource, engine: str, threads: int, context_length: int | None, activations: str,
                 kv_cache: str):
    if engine == "reference":
        from edgeflash.runtime.reference import ReferenceEngine

        return ReferenceEngine(source, context_length=context_length)
    from edgeflash.runtime.native_engine import NativeEngine

    return NativeEngine(source, threads=threads, context_length=context_length, activations=activations,
                        kv_format=kv_cache)


def _load_budgeted(path: Path, memory_budget: str | int, engine: str, threads: int, context_length: int | None,
                   strategy: str, activations: str, kv_cache: str, approximate: dict, speculative: str):
    import gc

    from edgeflash.base.rss import current_rss_bytes, peak_rss_bytes, reset_peak_rss
    from edgeflash.base.sizes import parse_size
    from edgeflash.memory.budgeted import BudgetedEngine

    budget = parse_size(memory_budget)
    keep_large_allocations_mapped()  # freed temporaries leave the process instead of the heap
    if engine == "reference":
        raise UserError("memory_budget needs the native engine (the reference runtime keeps every weight in float32)")
    before = current_rss_bytes()
    # Building the tokenizer makes temporaries several times the size of what it keeps. They are
    # freed before any weight loads, but the budget covers loading too, so the plan is told this
    # peak. (Measuring it resets the process's peak-RSS mark, which restarts at the current RSS.)
    peak_measured = reset_peak_rss()
    source = open_model(path, verify=False)  # checksums are verified with direct I/O while loading
    # The tokenizer builds its tables on first use: build them now, free what parsing left behind,
    # and count what stays (tokenizer and manifest) as a fixed cost of the budget.
    source.tokenizer.decode(source.tokenizer.encode("warm up the tokenizer"))
    gc.collect()
    release_free_heap()
    # Tensors the loader rewrote (llama q/k rows from a GGUF) are in that delta too; the plan
    # counts them as pinned weights.
    rewritten = sum(source.tensors[n].nbytes for n in source.info.get("rewritten_tensors", []))
    metadata = max(0, current_rss_bytes() - before - rewritten)
    opening_peak = peak_rss_bytes() - before if peak_measured else 0
    if context_length is None:
        from edgeflash.memory.planner import default_context

        context_length = default_context(source.spec, budget, kv_format=kv_cache)
    fixed = {"tokenizer_and_manifest": metadata}
    if speculative != "none":
        from edgeflash.runtime.speculative.budget import speculative_reserve

        fixed["speculative"] = speculative_reserve(speculative, source, context_length, kv_cache)
    engine_ = BudgetedEngine(source, budget=budget, strategy=strategy, fixed_costs=fixed, opening_peak=opening_peak,
                             threads=threads,
                             context_length=context_length, activations=activations, kv_format=kv_cache,
                             max_batch=BUDGETED_MAX_BATCH,
                             **approximate)
    return source, engine_


class Model:
    """A loaded model. Calls are serialized: one generation at a time per model."""

    def __init__(self, source: ModelSource, engine: Any):
        self.source = source
        self.engine = engine
        self.spec = source.spec
        self.tokenizer = source.tokenizer
        self.speculative = "none"  # the default for generate(); per call: speculative=...
        self._drafters: dict[str, Any] = {}
        self._lock = threading.Lock()

    def check_speculative(self, kind: str) -> str:
        if kind != "none":
            self._drafter(kind)  # build it now: a bad option fails at load, and its memory is taken up front
        return kind

    def drafter_bytes(self, kind: str) -> int:
        drafter = self._drafter(kind)
        return drafter.memory_bytes() if drafter is not None else 0

    def _drafter(self, kind: str) -> Any:
        if kind == "none":
            return None
        if kind not in self._drafters:
            from edgeflash.runtime.speculative import make_drafter

            if not hasattr(self.engine, "forward_tree"):
                raise UserError(f"speculative decoding needs the native engine, not {self.engine.name!r}")
            self._drafters[kind] = make_drafter(kind, self.engine)
        return self._drafters[kind]

    @property
    def name(self) -> str:
        return self.source.name

    def encode(self, text: str, add_bos: bool | None = None) -> list[int]:
        return self.tokenizer.encode(text, add_bos=add_bos)

    def decode(self, tokens: Sequence[int]) -> str:
        return self.tokenizer.decode(tokens)

    def generation(self, prompt: str | Sequence[int], max_tokens: int = 64, *, temperature: float = 0.0,
                   top_k: int = 0, top_p: float = 1.0, min_p: float = 0.0, repetition_penalty: float = 1.0,
                   seed: int | None = None, stop: Sequence[str] | str | None = None,
                   speculative: str | None = None) -> Generation:
        """A not-yet-started generation: iterate it for text pieces, then call `.result()`."""
        ids = self.encode(prompt) if isinstance(prompt, str) else [int(t) for t in prompt]
        params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                                repetition_penalty=repetition_penalty, seed=seed)
        stops = [stop] if isinstance(stop, str) else list(stop or [])
        drafter = self._drafter(self.speculative if speculative is None else speculative)
        return Generation(self.engine, ids, max_tokens, params, stops, drafter=drafter)

    def generate(self, prompt: str | Sequence[int], max_tokens: int = 64, **options: Any) -> GenerationResult:
        """Generate a completion; `result.text`, `result.tokens`, `result.stats`."""
        with self._lock:
            return self.generation(prompt, max_tokens, **options).result()

    def stream(self, prompt: str | Sequence[int], max_tokens: int = 64, **options: Any) -> Iterator[str]:
        """Yield text pieces as they are generated."""
        with self._lock:
            yield from self.generation(prompt, max_tokens, **options)

    def chat_prompt(self, messages: Sequence[dict[str, str]]) -> list[int]:
        """Token ids of a conversation rendered with the model's chat format, ready for the reply."""
        from edgeflash.runtime.tokenizer import render_chat

        for i, m in enumerate(messages):
            if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
                raise UserError(f"messages[{i}] must be a dict with string 'role' and 'content'")
        text = render_chat(self.tokenizer, list(messages), add_generation_prompt=True)
        ids = self.tokenizer.encode(text)
        bos = self.tokenizer.bos_id
        if len(ids) >= 2 and ids[0] == ids[1] == bos:  # the template wrote BOS itself
            ids = ids[1:]
        return ids

    def chat(self, messages: Sequence[dict[str, str]], max_tokens: int = 256, **options: Any) -> GenerationResult:
        """Reply to a conversation ([{"role": "user", "content": ...}, ...])."""
        return self.generate(self.chat_prompt(messages), max_tokens, **options)

    def chat_stream(self, messages: Sequence[dict[str, str]], max_tokens: int = 256, **options: Any) -> Iterator[str]:
        yield from self.stream(self.chat_prompt(messages), max_tokens, **options)

    def close(self) -> None:
        self.engine.close()

    def __enter__(self) -> Model:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
