"""`export()`: load -> calibrate -> quantize -> partition -> evaluate -> write -> verify.

Calibration runs before quantization because the calibrated quantizers need its activation
statistics; evaluation runs before writing so its report goes into the manifest, and the written
bundle is then re-opened and every checksum verified. Each stage is a public function of this
package (`calibrate`, `quantize_model`, `build_arena`/`plan_blocks`, `perplexity`,
`write_bundle`) that can be run and inspected on its own.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgeflash.base.errors import UserError
from edgeflash.export.calibrate import Calibration, calibrate
from edgeflash.export.evaluate import delta_pct, perplexity, sparse_perplexities
from edgeflash.export.ops import FastOps
from edgeflash.export.partition import build_arena, plan_blocks
from edgeflash.export.progress import bar, note
from edgeflash.export.quant.config import QuantConfig
from edgeflash.export.quant.schemes import resolve_config
from edgeflash.export.quantize import QuantizedTensor, quantize_model, quantized_source
from edgeflash.export.text import token_windows
from edgeflash.export.threads import export_threads
from edgeflash.export.writer import check_output, layout, write_bundle
from edgeflash.runtime.bundle.layout import FORMAT_VERSION, MAGIC
from edgeflash.runtime.source import ModelSource

TARGETS = ("bundle",)
# The platforms' own formats (edgeflash.export.targets); options they take besides `quant`.
PLATFORM_TARGETS = ("executorch", "onnx", "coreml")
PLATFORM_OPTIONS = ("chunks", "cache_len", "prefill_tokens", "kv", "group_size", "calibration_tokens", "overwrite",
                    "progress", "threads", "et_activations")
DEFAULT_SPARSITY = (0.3, 0.5, 0.7)


@dataclass
class ExportOptions:
    quant: str | QuantConfig = "q4_0"
    calibration: str | Path | None = None  # text file; default: the shakespeare calibration split
    calibration_tokens: int = 2048
    eval_tokens: int = 1024  # 0 = no evaluation (the report then has no perplexities)
    sparsity_eval_tokens: int = 512  # held-out tokens (the first windows) for each sparsity level
    window_tokens: int = 512
    sparsity: Sequence[float] = DEFAULT_SPARSITY
    neuron_arena: bool = True
    predictor_rank: int = 64  # 0 = no predictors
    top_tokens: int = 8192
    frequency_chars: int = 500_000  # calibration text counted for token frequencies
    group_size: int | None = None
    baseline: bool = True  # also evaluate the round-to-nearest baseline of a calibrated scheme
    overwrite: bool = False
    progress: bool = True
    threads: int = 2  # CPU threads for large matrix products

    def check(self) -> None:
        for name in ("calibration_tokens", "window_tokens", "top_tokens", "frequency_chars", "threads"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise UserError(f"{name} = {value!r}: expected an integer >= 1")
        for name in ("eval_tokens", "sparsity_eval_tokens", "predictor_rank"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise UserError(f"{name} = {value!r}: expected an integer >= 0")
        if not self.sparsity or any(not 0.0 < float(s) < 1.0 for s in self.sparsity):
            raise UserError(f"sparsity = {list(self.sparsity)}: expected fractions strictly between 0 and 1")


@dataclass
class ExportResult:
    path: Path
    manifest: dict[str, Any]
    calibration: Calibration
    timings: dict[str, float] = field(default_factory=dict)  # wall seconds per stage
    cpu_timings: dict[str, float] = field(default_factory=dict)  # process CPU seconds per stage

    @property
    def report(self) -> dict[str, Any]:
        return self.manifest["report"]


def export(source: Any, out_dir: str | Path, quant: str | QuantConfig = "q4_0", target: str = "bundle", *,
           config: Any = None, tokenizer: Any = None, **options: Any) -> ExportResult:
    """Export `source` (GGUF path, HF directory, bundle, alias like "default", a ModelSource, or a
    torch nn.Module with `config=` and `tokenizer=`) to a bundle directory `out_dir`, or with
    target="executorch" | "onnx" | "coreml" to that platform's format (`export_target`)."""
    check_target(target)
    if target in PLATFORM_TARGETS:
        return _export_platform(source, out_dir, quant, target, config, tokenizer, options)
    unknown = set(options) - {f for f in ExportOptions.__dataclass_fields__}
    if unknown:
        raise TypeError(f"export() got unknown options: {', '.join(sorted(unknown))}")
    opts = ExportOptions(quant=quant, **options)
    opts.check()
    out = Path(out_dir).expanduser()
    qconfig = resolve_config(opts.quant, opts.group_size)
    check_output(out, opts.overwrite)
    with export_threads():
        return _run(source, out, qconfig, opts, config, tokenizer)


def check_target(target: str) -> None:
    if target not in TARGETS + PLATFORM_TARGETS:
        raise UserError(f"target {target!r} is not available in this build "
                        f"(available: {', '.join(TARGETS + PLATFORM_TARGETS)})")


def _export_platform(source: Any, out_dir: str | Path, quant: str | QuantConfig, target: str, config: Any,
                     tokenizer: Any, options: dict[str, Any]):
    # Options that only mean something for a bundle (evaluation, sparsity, arenas...) are refused
    # rather than ignored, so no flag silently does nothing.
    bundle_only = sorted(set(options) - set(PLATFORM_OPTIONS))
    if bundle_only:
        raise UserError(f"target {target}: option(s) {', '.join(bundle_only)} apply to the bundle target only")
    from edgeflash.export.targets import export_target

    return export_target(source, out_dir, target, quant=quant, config=config, tokenizer=tokenizer, **options)


def _run(source: Any, out: Path, qconfig: QuantConfig, opts: ExportOptions, config: Any, tokenizer: Any
         ) -> ExportResult:
    timings: dict[str, float] = {}  # wall seconds per stage
    cpu_timings: dict[str, float] = {}  # CPU seconds of this process (all threads) per stage
    clock, cpu_clock = time.perf_counter(), time.process_time()

    def lap(stage: str) -> None:
        nonlocal clock, cpu_clock
        now, cpu_now = time.perf_counter(), time.process_time()
        timings[stage] = round(now - clock, 2)
        cpu_timings[stage] = round(cpu_now - cpu_clock, 2)
        clock, cpu_clock = now, cpu_now

    from edgeflash.export.sources import load_source

    model = load_source(source, config=config, tokenizer=tokenizer)
    for name, t in model.tensors.items():  # every tensor must have a plan before hours of work
        qconfig.plan(name, t.shape)
    note(f"{model.name}: {model.spec.family}, {model.spec.n_layers} layers, {model.weight_bytes / 2**20:.1f} MiB "
         f"of weights; scheme {qconfig.scheme}", opts.progress)
    lap("load")

    calib_text, calib_name = _calibration_text(opts.calibration)
    windows = token_windows(model.tokenizer, calib_text, opts.calibration_tokens, opts.window_tokens,
                            f"calibration text ({calib_name})")
    freq_ids = model.tokenizer.encode(calib_text[:opts.frequency_chars], add_bos=False)
    calibration = calibrate(model, windows, text_source=calib_name, window_tokens=opts.window_tokens,
                            sparsity_targets=list(opts.sparsity), frequency_ids=freq_ids, top_tokens=opts.top_tokens,
                            predictor_rank=opts.predictor_rank, progress=opts.progress, threads=opts.threads)
    lap("calibrate")

    quantized = quantize_model(model, qconfig, calibration.importance, opts.progress)
    lap("quantize")

    arenas = {}
    if opts.neuron_arena:
        fmt = qconfig.arena_format()
        for layer in bar(range(model.spec.n_layers), "partition: neuron arenas", opts.progress, unit="layer"):
            arenas[layer] = build_arena(model, layer, calibration.neuron_order[layer], fmt, quantized)
    blocks = plan_blocks(quantized, arenas, calibration.predictors)
    lap("partition")

    report = _evaluate(model, quantized, qconfig, calibration, opts)
    lap("evaluate")

    report["size_by_role"], report["bundle_bytes"] = _sizes(blocks)
    report["fallbacks"] = [{"name": q.tensor.name, "from": q.plan.fallback_from, "to": q.plan.format,
                            "reason": q.plan.reason} for q in quantized.values() if q.plan.fallback_from]
    report["tensors"] = [q.report() for q in quantized.values()]
    report["timings_s"] = dict(timings)
    report["cpu_s"] = dict(cpu_timings)
    manifest = {
        "magic": MAGIC, "format_version": FORMAT_VERSION, "created_by": f"edgeflash {_version()}",
        "model": {"name": model.name, "spec": model.spec.to_dict()},
        "source": _describe_source(model), "quant": qconfig.to_dict(),
        "calibration": calibration.to_manifest(), "report": report,
    }
    total = report["bundle_bytes"]
    with _ByteBar(total, opts.progress) as progress_bar:
        manifest = write_bundle(out, blocks, manifest, model.tokenizer.to_json(), model.tokenizer.tables(),
                                overwrite=opts.overwrite,
                                on_progress=progress_bar.update, cleanup_note=lambda m: note(m, opts.progress))
    lap("write")

    from edgeflash.runtime.bundle import Bundle

    Bundle.open(out, verify=True)  # read back: every block checksum
    lap("verify")
    # the manifest on disk has the timings up to evaluation; the result has all of them
    manifest["report"]["timings_s"], manifest["report"]["cpu_s"] = timings, cpu_timings
    return ExportResult(path=out, manifest=manifest, calibration=calibration, timings=timings,
                        cpu_timings=cpu_timings)


def _calibration_text(path: str | Path | None) -> tuple[str, str]:
    if path is None:
        from edgeflash.export.corpus import calibration_text

        try:
            return calibration_text(), "shakespeare (calibration split: every play but the held-out ones)"
        except FileNotFoundError as e:
            raise UserError(str(e)) from None
    p = Path(path).expanduser()
    try:
        return p.read_text(encoding="utf-8", errors="replace"), str(p)
    except OSError as e:
        raise UserError(f"{p}: cannot read the calibration text ({e.strerror})") from None


def _evaluate(model: ModelSource, quantized: dict[str, QuantizedTensor], qconfig: QuantConfig,
              calibration: Calibration, opts: ExportOptions) -> dict[str, Any]:
    if opts.eval_tokens == 0:
        return {"eval": None}
    from edgeflash.export.corpus import HELDOUT_PLAYS, heldout_text

    windows = token_windows(model.tokenizer, heldout_text(), opts.eval_tokens, opts.window_tokens,
                            "held-out text")
    report: dict[str, Any] = {"eval": {"text": f"held-out shakespeare plays ({', '.join(HELDOUT_PLAYS)})",
                                       "tokens": sum(len(w) - 1 for w in windows), "windows": len(windows),
                                       "window_tokens": opts.window_tokens}}
    ops = FastOps(threads=opts.threads)
    ref = perplexity(model, windows, ops, "evaluate: source", opts.progress)
    ops.release()
    exact = all(q.sqnr_db is None for q in quantized.values())
    exported_model = quantized_source(model, quantized)
    ops = FastOps(threads=opts.threads)
    exp = ref if exact else perplexity(exported_model, windows, ops, "evaluate: exported", opts.progress)
    report["perplexity"] = {"source": round(ref.perplexity, 4), "exported": round(exp.perplexity, 4),
                            "delta_pct": delta_pct(exp.perplexity, ref.perplexity), "identical_weights": exact}
    thresholds = {s: calibration.threshold_for(s) for s in calibration.sparsity_targets}
    n_sparse = _windows_for(windows, opts.sparsity_eval_tokens)
    report["sparsity"] = sparse_perplexities(exported_model, windows[:n_sparse], thresholds, exp, ops, opts.progress)
    ops.release()
    baseline = qconfig.rtn_baseline() if opts.baseline else None
    if baseline is not None:
        base_q = quantize_model(model, baseline, None, opts.progress, desc="quantize: round-to-nearest baseline")
        base_ops = FastOps(threads=opts.threads)
        base = perplexity(quantized_source(model, base_q), windows, base_ops, "evaluate: baseline", opts.progress)
        base_ops.release()
        report["baseline"] = {"scheme": baseline.scheme, "description": baseline.description,
                              "perplexity": round(base.perplexity, 4),
                              "delta_pct": delta_pct(base.perplexity, ref.perplexity),
                              "weight_bytes": sum(q.tensor.nbytes for q in base_q.values()),
                              "calibrated_weight_bytes": sum(q.tensor.nbytes for q in quantized.values())}
    if calibration.predictors:
        ps = calibration.predictors
        report["predictors"] = {"rank": calibration.predictor_rank, "sparsity": calibration.frequency_sparsity,
                                "mean_recall": round(sum(p.recall for p in ps) / len(ps), 4),
                                "mean_precision": round(sum(p.precision for p in ps) / len(ps), 4),
                                "mean_predicted_active": round(sum(p.predicted_active for p in ps) / len(ps), 4)}
    return report


def _windows_for(windows: list[list[int]], tokens: int) -> int:
    """How many leading windows hold `tokens` tokens (at least one)."""
    total = 0
    for i, w in enumerate(windows):
        total += len(w)
        if total >= tokens:
            return i + 1
    return len(windows)


def _sizes(blocks) -> tuple[dict[str, int], int]:
    by_role: dict[str, int] = {}
    placed = layout(blocks)
    for p in placed:
        for t, role in p.plan.tensors:
            by_role[role] = by_role.get(role, 0) + t.nbytes
        if p.plan.arena is not None:
            by_role["neurons"] = by_role.get("neurons", 0) + p.plan.arena.data.nbytes
    total = placed[-1].offset + placed[-1].nbytes if placed else 0
    by_role["padding"] = total - sum(by_role.values())
    return by_role, total


def _describe_source(model: ModelSource) -> dict[str, Any]:
    formats: dict[str, int] = {}
    for t in model.tensors.values():
        formats[t.fmt] = formats.get(t.fmt, 0) + 1
    return {"kind": model.kind, "path": str(model.path), "name": model.name,
            "file_bytes": model.info.get("file_bytes"), "tensor_formats": formats}


def _version() -> str:
    from edgeflash.base import __version__

    return __version__


class _ByteBar:
    def __init__(self, total: int, enabled: bool):
        from edgeflash.export.progress import tqdm_bytes

        self._bar = tqdm_bytes(total, "write", enabled)

    def __enter__(self):
        return self._bar

    def __exit__(self, *exc: object) -> None:
        self._bar.close()
