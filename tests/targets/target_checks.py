"""Parity checks shared by the target test modules (a plain module: conftest names collide
across test folders)."""

from __future__ import annotations

from edgeflash.export.targets.parity import compare, prompts_from_heldout, summarize
from edgeflash.export.targets.runner import TargetRunner

PROMPTS = 3
PROMPT_TOKENS = 16
NEW_TOKENS = 32


def parity(result, reference, cache: dict) -> dict:
    """Parity summary of the export `result` against the reference runtime on `reference`."""
    runner = TargetRunner(result.path, threads=2)
    prompts = prompts_from_heldout(runner.tokenizer, PROMPTS, PROMPT_TOKENS)
    return summarize(compare(runner, reference, prompts, NEW_TOKENS, reference_cache=cache))


def assert_parity(summary: dict, max_abs_error: float) -> None:
    """Logits within `max_abs_error` of the reference after every prompt token and after the
    prefill; the greedy 32-token continuation identical on most prompts."""
    detail = {k: v for k, v in summary.items() if k != "per_prompt"}
    assert summary["max_abs_error"] < max_abs_error, detail
    assert summary["prefill_max_abs_error"] < max_abs_error, detail
    assert summary["min_top1_agreement"] >= 0.9, detail
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
