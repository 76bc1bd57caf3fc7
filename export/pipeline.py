"""`export()`: a model to a bundle, one layer at a time.

    load (memory-mapped) -> plan the layout -> per layer: calibrate (torch, source weights),
    quantize, build the neuron arena, fit the predictor, write its blocks -> tables (head,
    embedding) in row chunks -> verify -> evaluate on the native engine -> manifest -> rename

The source stays memory-mapped and each layer's pages are handed back once the layer is written,
so peak memory is one layer's float weights plus the calibration activations (and, for the
evaluation at the end, one model on the engine), not the model in float32. Every stage is a
public function of this package that can be run on its own (`LayerwiseRunner`, `quantize_tensor`,
`plan_layout`, `BundleWriter`, `perplexity`).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from edgeflash.base.errors import UserError
from edgeflash.export.calibrate import Calibration
from edgeflash.export.partition import BlockSpec, arena_rows, ffn_layout, plan_layout
from edgeflash.export.peak_memory import TABLE_CHUNK_VALUES, available_memory, expected_peak, rss_peak_bytes
from edgeflash.export.progress import StageClock, bar, note
from edgeflash.export.quant.config import ARENA_KEEP, QuantConfig
from edgeflash.export.quant.methods import dequantize_matrix, prepare_importance, quantize_matrix
from edgeflash.export.quant.schemes import resolve_config
from edgeflash.export.quant.weighted import quantize_threads
from edgeflash.export.quantize import (
    SQNR_SAMPLE_VALUES,
    QuantizedTensor,
    quantize_tensor,
    source_values,
    sqnr_db,
)
from edgeflash.export.statistics import LayerCalibration, token_frequencies
from edgeflash.export.text import token_windows
from edgeflash.export.threads import export_threads
from edgeflash.export.writer import BundleWriter, check_output
from edgeflash.runtime.bundle.arena import ArenaTensor, arena_down_format
from edgeflash.runtime.bundle.layout import FORMAT_VERSION, MAGIC
from edgeflash.runtime.source import ModelSource
from edgeflash.runtime.tensors import Tensor

TARGETS = ("bundle",)
# The platforms' own formats (edgeflash.export.targets); options they take besides `quant`.
PLATFORM_TARGETS = ("executorch", "onnx", "coreml")
PLATFORM_OPTIONS = ("chunks", "cache_len", "prefill_tokens", "kv", "group_size", "calibration_tokens", "overwrite",
                    "progress", "threads", "et_activations")
DEFAULT_SPARSITY = (0.3, 0.5, 0.7)
QUICK_EVAL_TOKENS = 512  # the default report: one window of held-out text
FULL_EVAL_TOKENS = 1024
USER_HELDOUT_FRACTION = 0.1  # of a --calibration text, kept out of calibration for the report
DEPRECATED = {"sparsity": "sparsity_levels"}  # option names of earlier releases


@dataclass
class ExportOptions:
    quant: str | QuantConfig = "q4_0"
    calibration: str | Path | None = None  # text file; default: code for code models, else the plays
    calibration_tokens: int = 2048
    eval_tokens: int | None = None  # held-out tokens; None = 512 (1024 with full_report); 0 = no evaluation
    sparsity_eval_tokens: int = 512  # held-out tokens for each sparsity level (full report)
    window_tokens: int = 512
    sparsity_levels: Sequence[float] = DEFAULT_SPARSITY
    neuron_arena: bool = True
    predictor_rank: int = 64  # 0 = no predictors
    top_tokens: int = 8192
    frequency_chars: int = 500_000  # calibration text counted for token frequencies
    group_size: int | None = None
    full_report: bool = False  # both texts, each sparsity level, the round-to-nearest baseline
    baseline: bool = True  # with full_report: also evaluate the round-to-nearest version of a calibrated scheme
    overwrite: bool = False
    progress: bool = True
    threads: int = 2  # CPU threads
    check_memory: bool = True  # refuse when the machine has less memory available than the export needs

    def check(self) -> None:
        for name in ("calibration_tokens", "window_tokens", "top_tokens", "frequency_chars", "threads"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise UserError(f"{name} = {value!r}: expected an integer >= 1")
        for name in ("sparsity_eval_tokens", "predictor_rank") + (("eval_tokens",) if self.eval_tokens is not None
                                                                   else ()):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise UserError(f"{name} = {value!r}: expected an integer >= 0")
        levels = list(self.sparsity_levels)
        if not levels or any(not 0.0 < float(s) < 1.0 for s in levels):
            raise UserError(f"sparsity_levels = {levels}: expected fractions strictly between 0 and 1")

    @property
    def report_tokens(self) -> int:
        if self.eval_tokens is not None:
            return self.eval_tokens
        return FULL_EVAL_TOKENS if self.full_report else QUICK_EVAL_TOKENS


@dataclass
class ExportResult:
    path: Path
    manifest: dict[str, Any]
    calibration: Calibration
    timings: dict[str, float] = field(default_factory=dict)  # wall seconds per stage (stages overlap)
    totals: dict[str, float] = field(default_factory=dict)  # wall and CPU seconds of the whole export

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
    for old, new in DEPRECATED.items():
        if old in options:
            warnings.warn(f"export option {old!r} is now {new!r}", DeprecationWarning, stacklevel=2)
            options[new] = options.pop(old)
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


# -- texts ---------------------------------------------------------------------------------------

@dataclass
class Texts:
    calibration: str
    calibration_name: str
    heldout: list[tuple[str, str]]  # (description, text): the first is the quick report's


def choose_texts(model: ModelSource, calibration: str | Path | None, full_report: bool) -> Texts:
    """Model-appropriate text: code for a code model (by its name or chat template), the plays
    otherwise; a --calibration text replaces both, its last tenth held out for the report."""
    from edgeflash.export import corpus

    prose = ("held-out shakespeare plays (" + ", ".join(corpus.HELDOUT_PLAYS) + ")", _text(corpus.heldout_text))
    code = ("held-out Python standard library sources", _text(corpus.code_heldout_text))
    if calibration is not None:
        p = Path(calibration).expanduser()
        try:
            text = p.read_text(encoding="utf-8", errors="replace")
        except OSError as e:
            raise UserError(f"{p}: cannot read the calibration text ({e.strerror})") from None
        cut = int(len(text) * (1 - USER_HELDOUT_FRACTION))
        cut = text.find("\n", cut) + 1 or cut
        heldout = [(f"the last {USER_HELDOUT_FRACTION:.0%} of {p}", text[cut:])]
        return Texts(text[:cut], str(p), heldout + ([prose, code] if full_report else []))
    template = getattr(model.tokenizer, "chat_template", None)
    if corpus.is_code_model(model.name, template) or corpus.is_code_model(str(model.path)):
        return Texts(_text(corpus.code_calibration_text), "Python standard library sources (calibration files)",
                     [code, prose] if full_report else [code])
    return Texts(_text(corpus.calibration_text), "shakespeare (calibration split: every play but the held-out ones)",
                 [prose, code] if full_report else [prose])


def _text(fn) -> str:
    try:
        return fn()
    except FileNotFoundError as e:
        raise UserError(str(e)) from None


# -- the run -------------------------------------------------------------------------------------

def _run(source: Any, out: Path, qconfig: QuantConfig, opts: ExportOptions, config: Any, tokenizer: Any
         ) -> ExportResult:
    clock = StageClock(opts.progress)
    from edgeflash.base.heap import keep_large_allocations_mapped
    from edgeflash.export.sources import load_source

    keep_large_allocations_mapped()  # a layer's freed float weights go back to the OS, not to the heap

    with clock.stage("load"):
        model = load_source(source, config=config, tokenizer=tokenizer)
        layout_kind = ffn_layout(qconfig, model.spec.d_ff, model.spec.d_model, opts.neuron_arena)
        blocks = plan_layout(model, qconfig, layout_kind, opts.predictor_rank)  # every tensor has a plan
        texts = choose_texts(model, opts.calibration, opts.full_report)
        windows = token_windows(model.tokenizer, texts.calibration, opts.calibration_tokens, opts.window_tokens,
                                f"calibration text ({texts.calibration_name})")
        freq_ids = model.tokenizer.encode(texts.calibration[:opts.frequency_chars], add_bos=False)
    bundle_bytes = _bundle_bytes(blocks)
    note(f"{model.name}: {model.spec.family}, {model.spec.n_layers} layers, {model.weight_bytes / 2**20:.1f} MiB of "
         f"weights; scheme {qconfig.scheme}; bundle {bundle_bytes / 2**20:.1f} MiB, FFN stored "
         f"{'once, as neuron arenas' if layout_kind == 'arena' else layout_kind}", opts.progress)
    expected = _check_memory(model, opts, bundle_bytes)

    writer = BundleWriter(out, blocks, opts.overwrite, cleanup_note=lambda m: note(m, opts.progress))
    try:
        result = _stream(model, writer, blocks, qconfig, opts, texts, windows, freq_ids, clock, expected)
    except BaseException:
        writer.abort()
        raise
    return result


def _bundle_bytes(blocks: list[BlockSpec]) -> int:
    from edgeflash.export.writer import layout

    placed = layout(blocks)
    return placed[-1].offset + placed[-1].nbytes if placed else 0


def _check_memory(model: ModelSource, opts: ExportOptions, bundle_bytes: int) -> int:
    file_bytes = int(model.info.get("file_bytes") or model.weight_bytes)
    eval_bytes = max(file_bytes, bundle_bytes) if opts.report_tokens else 0
    peak = expected_peak(model, opts.calibration_tokens, opts.window_tokens, eval_bytes, opts.predictor_rank)
    avail, where = available_memory()
    note(f"expected peak memory {peak.describe()}; available {avail / 2**30:.2f} GiB ({where})", opts.progress)
    if opts.check_memory and peak.total > avail:
        raise UserError(f"{model.path}: this export needs about {peak.total / 2**30:.2f} GiB of memory at its peak "
                        f"and {where} leaves {avail / 2**30:.2f} GiB; free memory, lower --calibration-tokens, "
                        "or pass --no-memory-check to try anyway")
    return peak.total


def _stream(model: ModelSource, writer: BundleWriter, blocks: list[BlockSpec], qconfig: QuantConfig,
            opts: ExportOptions, texts: Texts, windows: list[list[int]], freq_ids: list[int],
            clock: StageClock, expected_peak_bytes: int) -> ExportResult:
    from edgeflash.base.heap import release_free_heap
    from edgeflash.export.layerwise import LayerRun, LayerwiseRunner, head_name, release_tensors

    spec = model.spec
    by_name = {b.name: b for b in blocks}
    targets = sorted({float(s) for s in opts.sparsity_levels})
    reports: dict[str, dict[str, Any]] = {}
    fallbacks: list[dict[str, str]] = []  # tensors not stored in their rule's format, and why
    importance: dict[str, np.ndarray] = {}

    with clock.stage("calibrate"):
        runner = LayerwiseRunner(model, windows, keep_ffn_inputs=opts.predictor_rank > 0, threads=opts.threads)
    tied = "output.weight" not in model.tensors
    if not tied:  # an untied embedding only serves rows: nothing to calibrate it with
        with clock.stage("quantize"):
            _write_table(model, writer, by_name["embedding"], qconfig, None, reports, fallbacks, opts)

    def finish_layer(run: LayerRun) -> None:
        """Statistics, quantization, arena, predictor and write of one layer: on a second thread,
        while the next layer runs over the calibration windows."""
        with clock.stage("quantize"), quantize_threads(opts.threads):  # cores calibration leaves idle
            lc = run.statistics(targets, opts.predictor_rank)
            _write_layer(model, writer, by_name, run.layer, qconfig, lc, reports, fallbacks, opts)
            runner.release_layer(run.layer)
            calibrated[run.layer] = lc

    calibrated: dict[int, LayerCalibration] = {}
    pending = None
    with ThreadPoolExecutor(1) as background:
        for layer in bar(range(spec.n_layers), "layers: calibrate, quantize, write", opts.progress, unit="layer"):
            with clock.stage("calibrate"):
                run = runner.run_layer(layer)
            if pending is not None:
                pending.result()  # one layer in flight: memory holds at most two layers' float weights
            pending = background.submit(finish_layer, run)
            del run
        if pending is not None:
            pending.result()
    layers = [calibrated[i] for i in range(spec.n_layers)]
    for lc in layers:
        importance.update(lc.importance)
    with clock.stage("calibrate"):
        importance.update(runner.head_importance())
        runner.close()
    with clock.stage("quantize"), quantize_threads(opts.threads):  # calibration is done: every core quantizes
        _write_globals(model, writer, by_name["globals"], qconfig, reports, fallbacks)
        head = by_name["head"] if "head" in by_name else by_name["embedding"]
        _write_table(model, writer, head, qconfig, importance.get(head_name(model)), reports, fallbacks, opts)
        release_tensors(model, list(model.tensors))
    release_free_heap()

    ids, counts = token_frequencies(freq_ids, spec.vocab_size, opts.top_tokens)
    calibration = Calibration.from_layers(
        layers, text_source=texts.calibration_name, tokens=sum(len(w) for w in windows), windows=len(windows),
        window_tokens=opts.window_tokens, importance=importance, targets=targets, top_token_ids=ids,
        top_token_counts=counts, frequency_tokens=len(freq_ids), predictor_rank=opts.predictor_rank)
    manifest = {
        "magic": MAGIC, "format_version": FORMAT_VERSION, "created_by": f"edgeflash {_version()}",
        "model": {"name": model.name, "spec": spec.to_dict()}, "source": _describe_source(model),
        "quant": qconfig.to_dict(), "calibration": calibration.to_manifest(),
        "report": {"eval": None},
    }
    tables = model.tokenizer.tables()
    tok_json = model.tokenizer.to_json()
    with clock.stage("write"):
        full = writer.finish(manifest, tok_json, tables)
    with clock.stage("verify"):
        from edgeflash.runtime.bundle import Bundle

        Bundle.open(writer.path, verify=False, unfinished=True).verify_by_reading()  # every block checksum, read back
    report: dict[str, Any] = {}
    if opts.report_tokens:
        with clock.stage("evaluate"):
            report = _evaluate(model, writer.path, texts, calibration, qconfig, opts)
    report.update(_sizes(full))
    report["fallbacks"] = fallbacks
    report["tensors"] = [reports[name] for name in _tensor_order(blocks) if name in reports]
    report["timings_s"], report["total_s"] = clock.wall, clock.totals()
    report["peak_rss_bytes"] = rss_peak_bytes()
    report["expected_peak_bytes"] = expected_peak_bytes
    manifest["report"] = report
    with clock.stage("write"):
        full = writer.finish(manifest, tok_json, tables)
        path = writer.commit()
    full["report"]["timings_s"], full["report"]["total_s"] = clock.wall, clock.totals()
    full["report"]["peak_rss_bytes"] = rss_peak_bytes()
    return ExportResult(path=path, manifest=full, calibration=calibration, timings=clock.wall,
                        totals=full["report"]["total_s"])


# -- per block -----------------------------------------------------------------------------------

def _tensor(model: ModelSource, name: str) -> Tensor:
    """A source tensor by canonical name; a bundle source's FFN matrices come from its arenas."""
    t = model.tensors.get(name)
    if t is None:
        arena = model.tensors.get(name.rsplit(".", 2)[0] + ".ffn_arena")
        if isinstance(arena, ArenaTensor):
            return arena.dense(name.split(".", 2)[2])
        raise KeyError(name)
    return t


def _quantized(model: ModelSource, name: str, qconfig: QuantConfig, importance: dict[str, np.ndarray],
               reports: dict[str, dict[str, Any]], fallbacks: list[dict[str, str]]) -> np.ndarray:
    t = _tensor(model, name)
    q = quantize_tensor(t, qconfig.plan(name, t.shape), importance.get(name))
    reports[name] = q.report()
    if q.plan.fallback_from:
        fallbacks.append(_fallback(name, q.plan.fallback_from, q.plan.format, q.plan.reason))
    return np.asarray(q.tensor.raw)


def _fallback(name: str, wanted: str, stored: str, reason: str) -> dict[str, str]:
    return {"name": name, "from": wanted, "to": stored, "reason": reason}


def _write_layer(model: ModelSource, writer: BundleWriter, by_name: dict[str, BlockSpec], layer: int,
                 qconfig: QuantConfig, lc: LayerCalibration, reports: dict[str, dict[str, Any]],
                 fallbacks: list[dict[str, str]], opts: ExportOptions) -> None:
    """The layer's blocks; each tensor is dequantized from the source when it is quantized, so one
    matrix exists in float32 at a time."""
    for kind in ("attention", "ffn", "neurons", "predictor"):
        block = by_name.get(f"layer.{layer}.{kind}")
        if block is None:
            continue
        tensors: dict[str, Any] = {}
        for slot in block.tensors:
            if slot.role == "predictor":
                p = lc.predictor
                values = p.a if slot.name.endswith("predictor_a.weight") else p.b
                tensors[slot.name] = np.ascontiguousarray(values, dtype=np.float16)
            else:
                tensors[slot.name] = _quantized(model, slot.name, qconfig, lc.importance, reports, fallbacks)
        arena = _arena(model, block, qconfig, lc, reports, fallbacks) if block.arena is not None else None
        writer.write_block(block.name, tensors, arena, lc.order if arena is not None else None)


def _arena(model: ModelSource, block: BlockSpec, qconfig: QuantConfig, lc: LayerCalibration,
           reports: dict[str, dict[str, Any]], fallbacks: list[dict[str, str]]) -> np.ndarray:
    """The layer's neuron arena, hot first. Gate and up rows are quantized like the dense matrices
    (weighted by the FFN input's E[x^2]); down columns, whose blocks run along d_model, weighted by
    E[x^2] of the layer's output through the next layer's input norm (Gemma 3, 512 held-out tokens:
    perplexity 37.3 against 37.8 unweighted and 37.4 for dense q4_0 rows). As the FFN's one copy the
    parts are reported as the FFN's tensors."""
    slot = block.arena
    prefix = f"blk.{slot.layer}."
    imp = lc.importance.get(prefix + "ffn_gate.weight")
    rows = {}
    for part in ("gate", "up", "down"):
        name = f"{prefix}ffn_{part}.weight"
        t = _tensor(model, name)
        plan = qconfig.plan(name, t.shape)
        # keep-arena's q8_0 down columns round to nearest: the weighted scale search gave Qwen2.5-Coder-0.5B
        # perplexity 137.43 against 136.96 (2044 held-out tokens; the source 136.88)
        method = plan.method if plan.method in ("rtn", "weighted") else "rtn"
        fmt = slot.part_format(part)
        keep = qconfig.neuron_format == ARENA_KEEP
        if keep and part != "down" and fmt == t.fmt:  # the source's rows as they are
            rows[part] = np.asarray(t.raw).reshape(t.rows, -1)
            if block.kind == "ffn":
                reports[name] = {"name": name, "role": "ffn", "format": fmt, "method": "copy", "source_format": t.fmt,
                                 "shape": list(t.shape), "nbytes": int(rows[part].nbytes), "sqnr_db": None,
                                 "weighted_sqnr_db": None, "stored": "neuron arena"}
            continue
        values = source_values(t)
        if part == "down":
            values = np.ascontiguousarray(values.T)  # [d_ff, d_model]: one row per neuron
        part_imp = imp if part != "down" else lc.output_importance
        rows[part] = quantize_matrix(values, fmt, method, part_imp)
        if block.kind == "ffn":  # the FFN's only copy: report it as the FFN's tensors
            if keep:
                wanted = fmt if part == "down" else t.fmt
            else:
                wanted = plan.format if part != "down" else arena_down_format(plan.format, slot.layer,
                                                                              model.spec.n_layers)
            if plan.fallback_from:
                fallbacks.append(_fallback(name, plan.fallback_from, fmt, plan.reason))
            elif fmt != wanted and keep:
                fallbacks.append(_fallback(name, t.fmt, fmt, f"the neuron arena kernels do not run {t.fmt} rows, "
                                           "or gate and up differ in format"))
            elif fmt != wanted:
                fallbacks.append(_fallback(name, plan.format, fmt, f"the neuron arena stores {part} as rows of "
                                           f"{slot.d_model} values in a 32-value block format"))
            sample = slice(None, None, max(1, values.size // SQNR_SAMPLE_VALUES))  # SQNR on evenly spaced rows
            approx = dequantize_matrix(rows[part][sample], fmt, slot.d_model)
            w = prepare_importance(part_imp, slot.d_model) if part_imp is not None else None
            reports[name] = {"name": name, "role": "ffn", "format": fmt, "method": method,
                             "source_format": t.fmt, "shape": list(t.shape), "nbytes": int(rows[part].nbytes),
                             "sqnr_db": _db(sqnr_db(values[sample], approx)),
                             "weighted_sqnr_db": _db(sqnr_db(values[sample], approx, w)) if w is not None else None,
                             "stored": "neuron arena" + (" (columns)" if part == "down" else "")}
    return arena_rows(rows["gate"], rows["up"], rows["down"], lc.order, slot)


def _db(v: float) -> float:
    return round(v, 2) if np.isfinite(v) else 999.0


def _write_globals(model: ModelSource, writer: BundleWriter, block: BlockSpec, qconfig: QuantConfig,
                   reports: dict[str, dict[str, Any]], fallbacks: list[dict[str, str]]) -> None:
    writer.write_block(block.name, {s.name: _quantized(model, s.name, qconfig, {}, reports, fallbacks)
                                    for s in block.tensors})


def _write_table(model: ModelSource, writer: BundleWriter, block: BlockSpec, qconfig: QuantConfig,
                 importance: np.ndarray | None, reports: dict[str, dict[str, Any]],
                 fallbacks: list[dict[str, str]], opts: ExportOptions) -> None:
    """The embedding or head block: one large table, quantized a row chunk at a time."""
    (slot,) = block.tensors
    t = _tensor(model, slot.name)
    plan = qconfig.plan(slot.name, t.shape)
    stats = {"signal": 0.0, "noise": 0.0, "wsignal": 0.0, "wnoise": 0.0}
    w = prepare_importance(importance, t.cols) if importance is not None else None

    def chunks() -> Iterator[np.ndarray]:
        step = max(1, TABLE_CHUNK_VALUES // t.cols)
        for r0 in bar(range(0, t.rows, step), f"{slot.name}", opts.progress, unit="chunk"):
            part = Tensor(t.name, t.fmt, (min(step, t.rows - r0), t.cols), t.raw[r0:r0 + step])
            if plan.format == "keep":
                yield np.asarray(part.raw)
                continue
            values = source_values(part)
            raw = quantize_matrix(values, plan.format, plan.method, importance)
            approx = dequantize_matrix(raw, plan.format, t.cols)
            err = values - approx
            stats["signal"] += float(np.dot(values.ravel(), values.ravel()))
            stats["noise"] += float(np.dot(err.ravel(), err.ravel()))
            if w is not None:
                stats["wsignal"] += float(np.dot((values * values).sum(axis=0), w))
                stats["wnoise"] += float(np.dot((err * err).sum(axis=0), w))
            yield raw

    writer.write_block(block.name, {slot.name: chunks()})
    q = QuantizedTensor(Tensor(t.name, slot.fmt, t.shape, np.empty((0, 0), np.uint8)), plan, t.fmt,
                        _ratio_db(stats["signal"], stats["noise"]) if plan.format != "keep" else None,
                        _ratio_db(stats["wsignal"], stats["wnoise"]) if w is not None else None)
    reports[slot.name] = q.report() | {"nbytes": slot.nbytes}
    if plan.fallback_from:
        fallbacks.append(_fallback(slot.name, plan.fallback_from, plan.format, plan.reason))


def _ratio_db(signal: float, noise: float) -> float:
    return float("inf") if noise == 0 else 10.0 * float(np.log10(max(signal, 1e-300) / noise))


def _tensor_order(blocks: list[BlockSpec]) -> list[str]:
    names = []
    for b in blocks:
        names += [t.name for t in b.tensors]
        if b.arena is not None and b.kind == "ffn":
            names += [f"blk.{b.arena.layer}.ffn_{p}.weight" for p in ("gate", "up", "down")]
    return names


# -- evaluation ----------------------------------------------------------------------------------

def _evaluate(model: ModelSource, bundle_path: Path, texts: Texts, calibration: Calibration, qconfig: QuantConfig,
              opts: ExportOptions) -> dict[str, Any]:
    """Perplexity of the source and of the written bundle on held-out text, both on the native
    engine; with the full report also every held-out text, each sparsity level and the baseline."""
    from edgeflash.export.evaluate import delta_pct, perplexity
    from edgeflash.export.layerwise import release_tensors
    from edgeflash.runtime.bundle import load_bundle

    tok = model.tokenizer
    report: dict[str, Any] = {}
    results = []
    bundle = load_bundle(bundle_path, verify=False, unfinished=True)  # verified just before
    for i, (description, text) in enumerate(texts.heldout):
        windows = token_windows(tok, text, opts.report_tokens, opts.window_tokens, f"held-out text ({description})")
        ref = perplexity(model, windows, f"evaluate: source on {description[:24]}", opts.progress, opts.threads)
        release_tensors(model, list(model.tensors))
        exp = perplexity(bundle, windows, f"evaluate: bundle on {description[:24]}", opts.progress, opts.threads)
        exact = qconfig.scheme == "keep"
        entry = {"text": description, "tokens": sum(len(w) - 1 for w in windows), "windows": len(windows),
                 "window_tokens": opts.window_tokens, "engine": "native",
                 "perplexity": {"source": _finite(ref.perplexity), "exported": _finite(exp.perplexity),
                                "delta_pct": _finite(delta_pct(exp.perplexity, ref.perplexity)),
                                "identical_weights": exact}}
        results.append(entry)
        if i == 0:
            report["eval"] = {k: entry[k] for k in ("text", "tokens", "windows", "window_tokens", "engine")}
            report["perplexity"] = entry["perplexity"]
            if opts.full_report and opts.neuron_arena:
                report["sparsity"] = _sparsity_levels(bundle, windows, calibration, exp, opts)
            if opts.full_report and opts.baseline and qconfig.rtn_baseline() is not None:
                report["baseline"] = _baseline(model, bundle_path, qconfig, windows, ref, opts)
    if len(results) > 1:
        report["texts"] = results
    return report


def _finite(value: float) -> float | None:
    """A perplexity for the manifest: null when the engine's logits were not finite (JSON has no NaN)."""
    return round(value, 4) if math.isfinite(value) else None


def _baseline(model: ModelSource, bundle_path: Path, qconfig: QuantConfig, windows: list[list[int]], ref,
              opts: ExportOptions) -> dict[str, Any]:
    """The round-to-nearest version of a calibrated scheme, exported the same way (same layout, no
    calibration) into a temporary bundle beside the export, evaluated and removed."""
    from edgeflash.export.evaluate import delta_pct, perplexity
    from edgeflash.runtime.bundle import load_bundle

    baseline = qconfig.rtn_baseline()
    layout_kind = ffn_layout(baseline, model.spec.d_ff, model.spec.d_model, opts.neuron_arena)
    blocks = plan_layout(model, baseline, layout_kind, 0)
    out = bundle_path / "baseline"  # inside the unfinished bundle: a kill leaves nothing else behind
    writer = BundleWriter(out, blocks, overwrite=True)
    try:
        by_name = {b.name: b for b in blocks}
        reports: dict[str, dict[str, Any]] = {}
        fallbacks: list[dict[str, str]] = []
        spec = model.spec
        for layer in bar(range(spec.n_layers), "baseline: quantize", opts.progress, unit="layer"):
            plain = LayerCalibration(layer=layer, importance={}, act_thresholds=np.zeros(0), gate_thresholds=np.zeros(0),
                                     frequency=np.zeros(spec.d_ff, np.float32),
                                     order=np.arange(spec.d_ff, dtype=np.int32), predictor=None)
            _write_layer(model, writer, by_name, layer, baseline, plain, reports, fallbacks, opts)
        _write_globals(model, writer, by_name["globals"], baseline, reports, fallbacks)
        for table in ("embedding", "head"):
            if table in by_name:
                _write_table(model, writer, by_name[table], baseline, None, reports, fallbacks, opts)
        writer.finish({"magic": MAGIC, "format_version": FORMAT_VERSION, "model": {"name": model.name,
                       "spec": spec.to_dict()}, "quant": baseline.to_dict(), "report": {}},
                      model.tokenizer.to_json(), model.tokenizer.tables())
        p = perplexity(load_bundle(writer.path, verify=False, unfinished=True), windows, "evaluate: baseline", opts.progress,
                       opts.threads)
        weight_bytes = _sizes(writer.finish({"magic": MAGIC, "format_version": FORMAT_VERSION, "model": {
            "name": model.name, "spec": spec.to_dict()}, "report": {}}, model.tokenizer.to_json()))["size_by_role"]
    finally:
        writer.abort()
    calibrated = _sizes(_manifest_on_disk(bundle_path))["size_by_role"]
    return {"scheme": baseline.scheme, "description": baseline.description, "perplexity": round(p.perplexity, 4),
            "delta_pct": delta_pct(p.perplexity, ref.perplexity),
            "weight_bytes": sum(v for k, v in weight_bytes.items() if k not in ("padding", "predictor")),
            "calibrated_weight_bytes": sum(v for k, v in calibrated.items() if k not in ("padding", "predictor"))}


def _manifest_on_disk(path: Path) -> dict[str, Any]:
    import json

    return json.loads((path / "manifest.json").read_text(encoding="utf-8"))


def _sparsity_levels(bundle: ModelSource, windows: list[list[int]], calibration: Calibration, dense,
                     opts: ExportOptions) -> list[dict[str, Any]]:
    """Perplexity with the FFN skipping neurons whose |act(gate . x)| is under each level's calibrated
    threshold (the native engine's arena FFN), against the dense bundle on the same tokens."""
    from edgeflash.export.evaluate import delta_pct, perplexity, windows_for

    if not any(isinstance(t, ArenaTensor) for t in bundle.tensors.values()):
        return []
    n = windows_for(windows, opts.sparsity_eval_tokens)
    dense_here = dense.first(n)
    rows = []
    for k, target in enumerate(calibration.sparsity_targets):
        p = perplexity(bundle, windows[:n], f"evaluate: sparsity {target:.0%}", opts.progress, opts.threads,
                       act_thresholds=[float(t) for t in calibration.act_thresholds[:, k]])
        rows.append({"target": target, "criterion": "|act(gate . x)| < act_threshold", "tokens": p.tokens,
                     "perplexity": round(p.perplexity, 4), "dense_perplexity": round(dense_here.perplexity, 4),
                     "delta_pct": delta_pct(p.perplexity, dense_here.perplexity)})
    return rows


def _sizes(manifest: dict[str, Any]) -> dict[str, Any]:
    by_role: dict[str, int] = {}
    for t in manifest["tensors"]:
        by_role[t["role"]] = by_role.get(t["role"], 0) + t["nbytes"]
    for b in manifest["blocks"]:
        if b.get("arena"):
            a = b["arena"]
            key = "ffn (neuron arenas)" if b["kind"] == "ffn" else "neurons"
            by_role[key] = by_role.get(key, 0) + a["n_neurons"] * a["stride"]
    total = manifest["weights"]["nbytes"]
    by_role["padding"] = total - sum(by_role.values())
    return {"size_by_role": by_role, "bundle_bytes": total}


def _describe_source(model: ModelSource) -> dict[str, Any]:
    formats: dict[str, int] = {}
    for t in model.tensors.values():
        formats[t.fmt] = formats.get(t.fmt, 0) + 1
    return {"kind": model.kind, "path": str(model.path), "name": model.name,
            "file_bytes": model.info.get("file_bytes"), "tensor_formats": formats}


def _version() -> str:
    from edgeflash.base import __version__

    return __version__
