"""Export to the platforms' own formats: ExecuTorch `.pte`, ONNX, Core ML `.mlpackage`.

    from edgeflash.export.targets import export_target
    result = export_target("smollm2-135m", "out/smol-et", "executorch", quant="q4_0", chunks=2)

Stages: load (the same loaders as the bundle) -> quantize (the same QuantConfig and quantize
stage, then each tensor in the form the target holds, `prepare.py`) -> build the decoder graph
per chunk (`graph.py`, from the project's family definitions) -> lower and write each chunk with
the target's toolchain (`executorch.py`, `onnx.py`, `coreml.py`) -> manifest (`chunks.py`).
`runner.TargetRunner` chains the chunks of an export and generates.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgeflash.base.errors import UserError

TARGETS = ("executorch", "onnx", "coreml")
# Python packages each target needs (the optional `backends` extra installs them all).
REQUIRES = {"executorch": ("executorch", "torchao"), "onnx": ("onnx", "onnxruntime", "onnxscript"),
            "coreml": ("coremltools",)}
SUPPORTED_FAMILIES = ("llama", "gemma3")  # what graph.py computes
DEFAULT_CACHE_LEN = 1024
DEFAULT_PREFILL_TOKENS = 64

__all__ = ["TARGETS", "TargetResult", "export_target", "require"]


@dataclass
class TargetResult:
    path: Path
    manifest: dict[str, Any]
    timings: dict[str, float] = field(default_factory=dict)  # wall seconds per stage


def require(target: str) -> None:
    """Fail with one line when a target's optional packages are missing."""
    if target not in REQUIRES:
        raise UserError(f"target {target!r} is not known (targets: bundle, {', '.join(TARGETS)})")
    missing = [m for m in REQUIRES[target] if importlib.util.find_spec(m) is None]
    if missing:
        raise UserError(f"target {target} needs the Python package(s) {', '.join(missing)}: "
                        "pip install 'edgeflash[backends]'")


def target_module(target: str):
    require(target)
    return importlib.import_module(f"edgeflash.export.targets.{target}")


def check_spec(spec, target: str) -> None:
    if spec.family not in SUPPORTED_FAMILIES:
        raise UserError(f"target {target}: model family {spec.family!r} has no export graph (supported: "
                        f"{', '.join(SUPPORTED_FAMILIES)})")


def export_target(source: Any, out: str | Path, target: str, quant: Any = "q4_0", chunks: int = 1, *,
                  cache_len: int = DEFAULT_CACHE_LEN, prefill_tokens: int = DEFAULT_PREFILL_TOKENS,
                  kv: str | None = None, group_size: int | None = None, calibration_tokens: int = 512,
                  overwrite: bool = False, progress: bool = True, threads: int = 2, config: Any = None,
                  tokenizer: Any = None, et_activations: str | None = None) -> TargetResult:
    """Export `source` (path, alias, ModelSource, or nn.Module with `config` and `tokenizer`) to
    `out` for `target`, split into `chunks`. `et_activations` (executorch only): "int8" (default,
    XNNPACK's 8da4w / 8da8w kernels) or "f32" (weight-only: float32 activations against the same
    codes, matching the reference runtime to float rounding; slower, int4 codes a byte each)."""
    from edgeflash.export.progress import note
    from edgeflash.export.quant import resolve_config
    from edgeflash.export.sources import load_source
    from edgeflash.export.targets.chunks import TOKENIZER_FILE, plan_chunks
    from edgeflash.export.writer import check_output, clean_stale, move_into_place

    module = target_module(target)
    kv = kv or module.DEFAULT_KV
    if kv not in module.KV_MODES:
        raise UserError(f"target {target}: kv = {kv!r} is not available (choose {', '.join(module.KV_MODES)})")
    options: dict[str, Any] = {}
    if et_activations is not None:
        if target != "executorch":
            raise UserError(f"et_activations: only for target executorch, not {target}")
        if et_activations not in module.ACTIVATIONS:
            raise UserError(f"et_activations = {et_activations!r}: choose {', '.join(module.ACTIVATIONS)}")
    if target == "executorch":
        options["activations"] = et_activations or module.DEFAULT_ACTIVATIONS
    for name, value, low in (("cache_len", cache_len, 2), ("prefill_tokens", prefill_tokens, 1),
                             ("calibration_tokens", calibration_tokens, 0), ("threads", threads, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise UserError(f"{name} = {value!r}: expected an integer >= {low}")
    out = Path(out).expanduser()
    try:
        clean_stale(out, lambda message: note(message, progress))
    except OSError as e:
        raise UserError(f"{out}: cannot clean up after an earlier export ({e.strerror or e})") from None
    check_output(out, overwrite, what="export")
    qconfig = resolve_config(quant, group_size)
    timings: dict[str, float] = {}
    clock = time.perf_counter()

    def lap(stage: str) -> None:
        nonlocal clock
        now = time.perf_counter()
        timings[stage] = round(now - clock, 2)
        clock = now

    import torch

    torch.set_num_threads(threads)
    model = load_source(source, config=config, tokenizer=tokenizer)
    check_spec(model.spec, target)
    if cache_len > model.spec.context_length:
        raise UserError(f"cache_len = {cache_len}: the model's context is {model.spec.context_length} tokens")
    if prefill_tokens > cache_len:
        raise UserError(f"prefill_tokens = {prefill_tokens}: more than cache_len {cache_len}")
    plan = plan_chunks(model.spec.n_layers, chunks)
    from edgeflash.export.targets.prepare import check_config, prepare

    check_config(model, qconfig, module.FORMATS, target)
    lap("load")
    importance = _importance(model, calibration_tokens, progress, threads) if qconfig.calibrated else None
    lap("calibrate")
    prepared = prepare(model, qconfig, module.FORMATS, target, importance, progress, adapt=getattr(module, "adapt", None))
    lap("quantize")

    # Everything is written under a temporary name next to `out`, renamed into place at the end:
    # an error or a kill leaves no half-written export at `out`.
    tmp = out.parent / f"{out.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tmp.mkdir(parents=True)
    except OSError as e:
        raise UserError(f"{out.parent}: cannot create the export there ({e.strerror})") from None
    try:
        chunk_entries = []
        writing = ""  # what is being written, for the error message
        for chunk in plan:
            writing = f"chunk {chunk.index}"
            note(f"{target}: chunk {chunk.index + 1}/{len(plan)}, layers {chunk.layers.start}-{chunk.layers.stop - 1}",
                 progress)
            entry = module.write_chunk(prepared, chunk, tmp, kv=kv, cache_len=cache_len,
                                       prefill_tokens=prefill_tokens, **options)
            chunk_entries.append(entry)
            lap(f"chunk {chunk.index}")
        writing = TOKENIZER_FILE
        (tmp / TOKENIZER_FILE).write_text(model.tokenizer.to_json(), encoding="utf-8")
        manifest = _manifest(prepared, target, kv, cache_len, prefill_tokens, chunk_entries, timings, module,
                             options)
        from edgeflash.export.targets.chunks import write_manifest

        writing = "manifest.json"
        write_manifest(tmp, manifest)
        move_into_place(tmp, out)
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise UserError(f"{out}: writing {writing} failed ({e.strerror or e}); nothing was left behind") from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    timings["total"] = round(sum(timings.values()), 2)
    note(f"wrote {out} ({manifest['total_bytes'] / 2**20:.1f} MiB in {len(plan)} chunk(s), "
         f"{timings['total']:.0f} s)", progress)
    return TargetResult(out, manifest, timings)


def _importance(model, tokens: int, progress: bool, threads: int):
    """Per-column activation importance for the calibrated (weighted) quantizers, from the
    calibration split; 0 tokens = unweighted search."""
    if tokens == 0:
        return None
    from edgeflash.export.calibrate import calibrate
    from edgeflash.export.corpus import calibration_text
    from edgeflash.export.text import token_windows

    text = calibration_text()
    window = min(512, tokens)
    windows = token_windows(model.tokenizer, text, tokens, window, "calibration text")
    calibration = calibrate(model, windows, text_source="shakespeare calibration split", window_tokens=window,
                            sparsity_targets=[0.5], frequency_ids=[], top_tokens=1, predictor_rank=0,
                            progress=progress, threads=threads)
    return calibration.importance


def _manifest(prepared, target: str, kv: str, cache_len: int, prefill_tokens: int, chunks: list[dict],
              timings: dict[str, float], module, options: dict[str, Any] | None = None) -> dict[str, Any]:
    from edgeflash.base import __version__
    from edgeflash.export.targets.chunks import (
        MANIFEST_FORMAT,
        MANIFEST_VERSION,
        TOKENIZER_FILE,
        cache_layout,
    )

    spec = prepared.source.spec
    tok = prepared.source.tokenizer
    return {
        "format": MANIFEST_FORMAT, "version": MANIFEST_VERSION, "target": target,
        "created_by": f"edgeflash {__version__}",
        "model": {"name": prepared.source.name, "spec": spec.to_dict()},
        "quant": prepared.config.to_dict(),
        "target_weights": {"bytes_by_kind": prepared.bytes_by_kind(),
                           "form": module.weight_form(**options) if options else module.WEIGHT_FORM, **(options or {})},
        "tokenizer": {"file": TOKENIZER_FILE, "format": "edgeflash", "bos_id": tok.bos_id,
                      "eos_ids": sorted(tok.eos_ids)},
        "cache": cache_layout(spec, kv, cache_len),
        "methods": module.methods(prefill_tokens),
        "static_shapes": module.STATIC_SHAPES,
        "chunks": chunks,
        "total_bytes": sum(c["bytes"] for c in chunks),
        "timings_s": dict(timings),
    }
