"""The Python API: `load` a model, then `generate`, `stream` or `chat` with it."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any, Iterator, Sequence

from edgeflash.base.errors import UserError
from edgeflash.base.models import resolve_model
from edgeflash.runtime.generate import Generation, GenerationResult
from edgeflash.runtime.loader import ENGINES, LoadedModel, load_model
from edgeflash.runtime.sampler import SAMPLING_DEFAULTS, SamplingParams

__all__ = ["ENGINES", "SAMPLING_DEFAULTS", "GenerationResult", "Model", "load"]
TOOL_CHOICES = ("auto", "none", "required")


def load(model: str | Path = "default", *, memory_budget: str | int | None = None, threads: int = 2,
         engine: str = "auto", context_length: int | None = None, strategy: str = "flash",
         activations: str = "q8x2", kv_cache: str = "f16", sparsity: float | None = None, window: int = 4,
         head_shortlist: int | None = None, speculative: str | None = "none", ffn_fallback: bool = True,
         neuron_chunk: int = 0, requantize: str | None = None) -> Model:
    """Open a GGUF file, a Hugging Face directory, a bundle or a model alias ("default").

    memory_budget: one byte budget ("96MB", "1.5GiB" or bytes) for everything loading and running
    the model allocates; weights that do not fit are read from flash for every token.
    strategy: how a budgeted run streams ("flash", "hybrid" or "naive"; see edgeflash.memory.planner).
    activations: "q8x2" (default, agrees with the reference), "q8" (fastest) or "f32".
    kv_cache: "f16" (default), "q8_0", which halves the KV cache's memory at a small quality cost, or
    "kivi2" (2-bit keys and values, the newest tokens in q8_0), about a quarter of f16's at 2048+ tokens
    (docs/memory-budget.md; not with speculative decoding).
    sparsity, window, head_shortlist: approximate mode of a budgeted bundle (edgeflash.runtime.approximate):
    the FFN reads only predicted-active neurons through a cache of the last `window` tokens' neurons,
    and the head computes only the `head_shortlist` most frequent tokens. Off (exact) by default.
    neuron_chunk: bytes; with sparsity, read neurons in whole chunks of at least this size (in the
    arena's order, the most often active first): per token the `1 - sparsity`
    share of chunks with the most predicted activation, neighbours merged into one read, and the
    hottest neurons kept resident; 0 (default): each predicted-active neuron on its own.
    A sparsity level the planner expects (or measured) to be slower than exact flash at this budget
    is not used and the plan says so, unless `ffn_fallback=False`; sparsity="auto" measures exact
    flash and each calibrated level once per budget (remembered) and picks the fastest that agrees
    with exact flash's top-1 on at least 90% of tokens.
    speculative: "none" (or None), "lookup" (n-grams of the context), "self" (the model's first layers and a
    reduced head; needs a bundle), "draft:PATH" (a smaller model with the same tokenizer), "auto"
    (lookup, and a smaller model with the same tokenizer if one of the model aliases on this machine
    is one) or "auto:PATH" (lookup and that draft model). Lossless: greedy output is unchanged and
    sampling keeps the model's distribution.
    requantize: "q4_0", "q8_0" or "q3_k": without a memory budget, every weight matrix stored with more
    bits per weight is converted to this format at load (a GGUF's 5-, 6- and 8-bit matrices to q4_0,
    say; q3_k needs rows of a multiple of 256 values, other matrices get q4_0 and
    stats["converted_formats"] lists them): fewer bytes read per token, so faster decoding, at a
    quality cost to measure
    (benchmarks/engine/side_by_side.py prints perplexity beside speed). None keeps the file's formats."""
    return Model(load_model(resolve_model(model), memory_budget=memory_budget, threads=threads, engine=engine,
                            context_length=context_length, strategy=strategy, activations=activations,
                            kv_cache=kv_cache, sparsity=sparsity, window=window, head_shortlist=head_shortlist,
                            speculative=speculative, ffn_fallback=ffn_fallback, neuron_chunk=neuron_chunk,
                            requantize=requantize))


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
            if getattr(self.engine, "kv_format", None) == "kivi2":
                raise UserError(f"speculative = {kind!r}: a kivi2 KV cache does not verify token trees; load the "
                                "model with kv_cache = 'f16' or 'q8_0' for speculative decoding")
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
                   frequency_penalty: float = 0.0, presence_penalty: float = 0.0, repeat_last_n: int = 64,
                   seed: int | None = None, stop: Sequence[str] | str | None = None,
                   speculative: str | None = None, logprobs: int | None = None,
                   json_schema: dict[str, Any] | bool | None = None, grammar: str | None = None) -> Generation:
        """A not-yet-started generation: iterate it for text pieces, then call `.result()`.

        Greedy unless `temperature` > 0 (the same prompt gives the same text); SAMPLING_DEFAULTS
        holds what the command line and the server use instead (`**SAMPLING_DEFAULTS, seed=1`).
        The penalties look at the last `repeat_last_n` tokens (prompt included).
        logprobs: record each token's log-probability and that many alternatives (`result.logprobs`).
        json_schema: the text is one JSON value valid under this schema (True: any JSON object).
        grammar: the text follows this llguidance Lark grammar (an alternative to json_schema)."""
        ids = self.encode(prompt) if isinstance(prompt, str) else [int(t) for t in prompt]
        params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                                repetition_penalty=repetition_penalty, frequency_penalty=frequency_penalty,
                                presence_penalty=presence_penalty, repeat_last_n=repeat_last_n, seed=seed)
        stops = [stop] if isinstance(stop, str) else list(stop or [])
        drafter = self._drafter(self.speculative if speculative is None else speculative)
        constraint = self._constraint(json_schema, grammar)
        return Generation(self.engine, ids, max_tokens, params, stops, drafter=drafter, constraint=constraint,
                          logprobs=logprobs)

    def _constraint(self, json_schema: dict[str, Any] | bool | None, grammar: str | None) -> Any:
        if json_schema is None or json_schema is False:
            if grammar is None:
                return None
        elif grammar is not None:
            raise UserError("give json_schema or grammar, not both")
        from edgeflash.runtime.structured import JSON_OBJECT, Constraint, json_grammar

        vocab = self.spec.vocab_size
        if grammar is not None:
            return Constraint(self.tokenizer, vocab, grammar)
        if json_schema is True:
            json_schema = JSON_OBJECT
        if not isinstance(json_schema, dict):
            raise UserError(f"json_schema = {json_schema!r:.60}: expected a JSON schema object or True")
        return Constraint(self.tokenizer, vocab, json_grammar(json_schema), what="json_schema")

    def generate(self, prompt: str | Sequence[int], max_tokens: int = 64, **options: Any) -> GenerationResult:
        """Generate a completion; `result.text`, `result.tokens`, `result.stats`."""
        with self._lock:
            return self.generation(prompt, max_tokens, **options).result()

    def stream(self, prompt: str | Sequence[int], max_tokens: int = 64, **options: Any) -> Iterator[str]:
        """Yield text pieces as they are generated."""
        with self._lock:
            yield from self.generation(prompt, max_tokens, **options)

    @property
    def has_chat_template(self) -> bool:
        return self.tokenizer.chat_format == "template"

    def chat_template_warning(self) -> str | None:
        """One line for a user about to chat with a model that carries no chat template (a base
        model, most likely), or None."""
        if self.has_chat_template:
            return None
        fallback = {"gemma": "Gemma turns", "chatml": "ChatML turns", "plain": "a plain 'User:/Assistant:' transcript"}
        return (f"warning: {self.name} has no chat template (a base model?); chat falls back to "
                f"{fallback[self.tokenizer.chat_format]} and replies may not make sense: use an instruct model")

    @property
    def tool_call_format(self) -> Any:
        """How this model's chat template writes tool calls (None: it has no tool calling)."""
        from edgeflash.runtime.structured import tool_call_format

        return tool_call_format(self.tokenizer)

    def chat_prompt(self, messages: Sequence[dict[str, Any]],
                    tools: Sequence[dict[str, Any]] | None = None) -> list[int]:
        """Token ids of a conversation rendered with the model's chat format, ready for the reply.
        `tools` (OpenAI's {"type": "function", "function": {...}} objects) are rendered by the
        model's own template; a message may then be a tool result ({"role": "tool", ...}) or an
        assistant message with `tool_calls`."""
        from edgeflash.runtime.tokenizer import chat_ids

        for i, m in enumerate(messages):
            if not isinstance(m, dict) or not isinstance(m.get("role"), str):
                raise UserError(f"messages[{i}] must be a dict with string 'role' and 'content'")
            content = m.get("content")
            if not isinstance(content, str) and not (content is None and m.get("tool_calls")):
                raise UserError(f"messages[{i}] must be a dict with string 'role' and 'content'")
        extra = {}
        if tools:
            if self.tool_call_format is None:
                raise UserError(f"tools: the chat template of {self.name} has no tool calling (use a model whose "
                                "template renders tools, such as Qwen2.5)")
            extra["tools"] = list(tools)
        # Control tokens come only from the chat format: text a message holds, such as
        # "<|im_end|>", is encoded as text (see edgeflash.runtime.tokenizer.chat).
        try:
            return chat_ids(self.tokenizer, list(messages), add_generation_prompt=True, **extra)
        except ValueError as e:
            raise UserError(f"messages: {e}") from None

    def chat(self, messages: Sequence[dict[str, Any]], max_tokens: int = 256, *,
             tools: Sequence[dict[str, Any]] | None = None, tool_choice: str = "auto",
             parallel_tool_calls: bool = True, **options: Any) -> GenerationResult:
        """Reply to a conversation ([{"role": "user", "content": ...}, ...]).

        With `tools`, the reply is either text or calls of those tools, kept to the model's call
        format and each tool's parameter schema: `result.tool_calls` (OpenAI's shape), and
        `result.text` is the text outside the calls. tool_choice: "auto", "none", "required" or a
        tool's name."""
        if not tools:
            return self.generate(self.chat_prompt(messages), max_tokens, **options)
        grammar = self.tool_grammar(tools, tool_choice, parallel_tool_calls)
        result = self.generate(self.chat_prompt(messages, tools), max_tokens, grammar=grammar, **options)
        content, calls = self.tool_call_format.parse(result.text, list(tools))
        if calls:
            result.text, result.tool_calls, result.finish_reason = content or "", calls, "tool_calls"
        return result

    def tool_grammar(self, tools: Sequence[dict[str, Any]], tool_choice: str = "auto",
                     parallel_tool_calls: bool = True) -> str:
        """The grammar a reply follows when `tools` are offered (see `chat`)."""
        from edgeflash.runtime.structured.tool_calls import check_tools

        fmt = self.tool_call_format
        if fmt is None:
            raise UserError(f"tools: the chat template of {self.name} has no tool calling (use a model whose "
                            "template renders tools, such as Qwen2.5)")
        names = check_tools(tools)
        if tool_choice not in TOOL_CHOICES and tool_choice not in names:
            raise UserError(f"tool_choice = {tool_choice!r:.60}: expected auto, none, required or one of the "
                            f"tools' names ({', '.join(names)})")
        return fmt.grammar(list(tools), tool_choice, parallel_tool_calls)

    def chat_stream(self, messages: Sequence[dict[str, Any]], max_tokens: int = 256, **options: Any) -> Iterator[str]:
        yield from self.stream(self.chat_prompt(messages), max_tokens, **options)

    def close(self) -> None:
        self.engine.close()

    def __enter__(self) -> Model:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
