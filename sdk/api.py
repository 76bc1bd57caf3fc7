"""The Python API: `load` a model, then `generate`, `stream` or `chat` with it."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any, Iterator, Sequence

from edgeflash.base.errors import UserError
from edgeflash.base.models import resolve_model
from edgeflash.runtime.generate import Generation, GenerationResult
from edgeflash.runtime.loader import ENGINES, LoadedModel, load_model
from edgeflash.runtime.sampler import SamplingParams

__all__ = ["ENGINES", "GenerationResult", "Model", "load"]


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
    sparsity, window, head_shortlist: approximate mode of a budgeted bundle (edgeflash.runtime.approximate):
    the FFN reads only predicted-active neurons through a cache of the last `window` tokens' neurons,
    and the head computes only the `head_shortlist` most frequent tokens. Off (exact) by default.
    speculative: "none", "lookup" (n-grams of the context), "self" (the model's first layers and a
    reduced head; needs a bundle), "draft:PATH" (a smaller model with the same tokenizer) or "auto".
    Lossless: greedy output is unchanged and sampling keeps the model's distribution."""
    return Model(load_model(resolve_model(model), memory_budget=memory_budget, threads=threads, engine=engine,
                            context_length=context_length, strategy=strategy, activations=activations,
                            kv_cache=kv_cache, sparsity=sparsity, window=window, head_shortlist=head_shortlist,
                            speculative=speculative))


class Model:
    """A loaded model. Calls are serialized: one generation at a time per model."""

    def __init__(self, loaded: LoadedModel):
        self.source = loaded.source
        self.engine = loaded.engine
        self.spec = loaded.source.spec
        self.tokenizer = loaded.source.tokenizer
        self.speculative = loaded.speculative  # the default for generate(); per call: speculative=...
        self._drafters: dict[str, Any] = {loaded.speculative: loaded.drafter} if loaded.drafter else {}
        self._lock = threading.Lock()

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
