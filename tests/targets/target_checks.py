"""Parity checks shared by the target test modules (a plain module: conftest names collide
across test folders)."""

from __future__ import annotations

from edgeflash.export.targets.parity import compare, prompts_from_heldout, summarize
from edgeflash.export.targets.runner import TargetRunner

PROMPTS = 3
PROMPT_TOKENS = 16
NEW_TOKENS = 32


def parity(result, reference, ops, cache: dict) -> dict:
    """Parity summary of the export `result` against the reference runtime on `reference` with
    `ops` (None = float32 arithmetic)."""
    runner = TargetRunner(result.path, threads=2)
    prompts = prompts_from_heldout(runner.tokenizer, PROMPTS, PROMPT_TOKENS)
    return summarize(compare(runner, reference, prompts, NEW_TOKENS, reference_cache=cache, ops=ops))


def assert_parity(summary: dict, max_abs_error: float, min_top1: float = 0.9, greedy: bool = True) -> None:
    """Logits within `max_abs_error` of the reference after every prompt token and after the
    prefill, the same argmax on at least `min_top1` of the positions of every prompt, and (with
    `greedy`) the greedy 32-token continuation identical on most prompts."""
    detail = {k: v for k, v in summary.items() if k != "per_prompt"}
    assert summary["max_abs_error"] < max_abs_error, detail
    assert summary["prefill_max_abs_error"] < max_abs_error, detail
    assert summary["min_top1_agreement"] >= min_top1, detail
    if greedy:
        assert summary["same_continuation"] * 2 > summary["prompts"], detail


def first_layers(model, layers: int | None):
    """`model` (a ModelSource) cut to its first `layers` layers; None = the whole model."""
    import dataclasses

    from edgeflash.runtime.source import ModelSource

    if layers is None:
        return model
    spec = dataclasses.replace(model.spec, n_layers=layers, layer_kinds=model.spec.layer_kinds[:layers])
    tensors = {name: t for name, t in model.tensors.items()
               if not name.startswith("blk.") or int(name.split(".")[1]) < layers}
    info = {**model.info, "name": f"{model.name} (first {layers} layers)"}
    return ModelSource(path=model.path, kind=model.kind, spec=spec, tokenizer=model.tokenizer, tensors=tensors,
                       info=info)


def chunk_matrices(source, chunk: dict) -> list[int]:
    """Value counts of the matrices a chunk holds: its layers', the embedding on the first chunk,
    the head on the last (a tied head is the embedding matrix again)."""
    layers = range(*chunk["layers"])
    sizes = [t.shape[0] * t.shape[1] for n, t in source.tensors.items()
             if n.startswith("blk.") and int(n.split(".")[1]) in layers and len(t.shape) == 2]
    embedding = source.tensors["token_embd.weight"].shape
    head = source.tensors.get("output.weight", source.tensors["token_embd.weight"]).shape
    return sizes + [embedding[0] * embedding[1]] * chunk["embedding"] + [head[0] * head[1]] * chunk["head"]


def int4_bytes(values: int, scale_bytes: int) -> int:
    """4-bit codes plus one scale of `scale_bytes` per 32 values."""
    return values // 2 + values // 32 * scale_bytes
