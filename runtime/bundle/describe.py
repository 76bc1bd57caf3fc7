"""Human-readable summaries of a bundle manifest (used by `edgeflash inspect` and `edgeflash export`)."""

from __future__ import annotations

from typing import Any

from edgeflash.base.printable import printable
from edgeflash.runtime.bundle.packed import is_packed


def _mib(n: int | None) -> str:
    return "-" if n is None else f"{n / 2**20:.1f} MiB"


def _length(values: Any) -> int:
    """How many values an array of the manifest has: packed (as written) or a list or array."""
    return values["shape"][0] if is_packed(values) else len(values)


def summary(manifest: dict[str, Any]) -> dict[str, Any]:
    """The machine-readable summary `inspect --json` prints: everything but the bulky tables."""
    spec = manifest["model"]["spec"]
    blocks = manifest.get("blocks", [])
    calib = manifest.get("calibration", {})
    return {
        "magic": manifest.get("magic"), "format_version": manifest.get("format_version"),
        "created_by": manifest.get("created_by"), "model": manifest["model"].get("name"), "spec": spec,
        "source": manifest.get("source"), "quant": manifest.get("quant"),
        "weights_bytes": manifest.get("weights", {}).get("nbytes"),
        "blocks": [{"name": b["name"], "kind": b["kind"], "offset": b["offset"], "nbytes": b["nbytes"],
                    "formats": _block_formats(manifest, b),
                    **({"arena": {k: v for k, v in b["arena"].items() if k != "order"}} if b.get("arena") else {})}
                   for b in blocks],
        "calibration": {k: v for k, v in calib.items() if k not in ("neurons", "token_frequencies")} | {
            "top_tokens": _length(calib.get("token_frequencies", {}).get("ids", []))},
        "report": {k: v for k, v in manifest.get("report", {}).items() if k != "tensors"},
    }


def _block_formats(manifest: dict[str, Any], block: dict[str, Any]) -> dict[str, int]:
    counts: dict[str, int] = {}
    names = set(block.get("tensors", []))
    for t in manifest.get("tensors", []):
        if t["name"] in names:
            counts[t["format"]] = counts.get(t["format"], 0) + 1
    return counts


def render(manifest: dict[str, Any], blocks: bool = True, tensors: bool = False) -> str:
    """Multi-line text: model, quantization, block plan, calibration and the quality report."""
    lines: list[str] = []
    spec = manifest["model"]["spec"]
    src = manifest.get("source", {})
    quant = manifest.get("quant", {})
    lines.append(f"bundle    {manifest['model'].get('name')}  (format {manifest.get('format_version')}, "
                 f"{manifest.get('created_by', '?')})")
    lines.append(f"model     {spec['family']}/{spec['arch']}: {spec['n_layers']} layers, d_model {spec['d_model']}, "
                 f"d_ff {spec['d_ff']}, {spec['n_heads']}/{spec['n_kv_heads']} heads x {spec['head_dim']}, "
                 f"vocab {spec['vocab_size']}, {'tied' if spec.get('tied_embeddings') else 'untied'} head")
    lines.append(f"source    {src.get('kind')} {src.get('path')}")
    rules = ", ".join(f"{r['role']}={r['format']}" + (f"/{r['method']}" if r["format"] not in ("keep", "f32", "f16") else "")
                      + (f" (fallback {r['fallback']})" if r.get('fallback') else "") for r in quant.get("rules", []))
    lines.append(f"quant     {quant.get('scheme')}: {rules}")
    lines.append(f"weights   {_mib(manifest.get('weights', {}).get('nbytes'))} in "
                 f"{len(manifest.get('blocks', []))} blocks (4 KiB aligned)")
    if blocks:
        lines.append("")
        lines.append(f"  {'block':<22} {'offset':>12} {'size':>11}  contents")
        for b in manifest.get("blocks", []):
            fmts = ", ".join(f"{n} {f}" for f, n in _block_formats(manifest, b).items())
            if b.get("arena"):
                a = b["arena"]
                part_fmts = "/".join(p["format"] for p in a["parts"])
                fmts = (fmts + "; " if fmts else "") + f"arena {a['n_neurons']} neurons x {a['stride']} B ({part_fmts})"
            lines.append(f"  {b['name']:<22} {b['offset']:>12} {_mib(b['nbytes']):>11}  {fmts}")
    calib = manifest.get("calibration") or {}
    if calib:
        text = calib.get("text", {})
        lines.append("")
        lines.append(f"calibration  {text.get('tokens')} tokens in {text.get('windows')} windows of "
                     f"{text.get('source')}")
        sp = calib.get("sparsity", {})
        if sp:
            lines.append(f"  sparsity thresholds |act| for targets {sp.get('targets')} (layer 0: "
                         f"{sp.get('act_threshold', [[]])[0]})")
        pred = calib.get("predictors")
        if pred:
            rec, prec = pred["recall"], pred["precision"]
            lines.append(f"  predictors rank {pred['rank']}: recall {sum(rec) / len(rec):.3f}, precision "
                         f"{sum(prec) / len(prec):.3f} (mean over layers, held-out calibration tokens)")
        tf = calib.get("token_frequencies", {})
        lines.append(f"  self-draft vocabulary: top {_length(tf.get('ids', []))} tokens of {tf.get('tokens_counted')} "
                     "counted")
    try:
        report = render_report(manifest.get("report") or {}, tensors=tensors)
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as e:
        # The report only informs; a manifest whose report lacks a field still describes its weights.
        report = [f"quality report: not shown, its fields are malformed ({printable(repr(e))})"]
    lines += [""] + report
    return "\n".join(lines)


def render_report(report: dict[str, Any], tensors: bool = False) -> list[str]:
    lines = ["quality report"]
    ev = report.get("eval")
    if ev:
        engine = f", {ev['engine']} engine" if ev.get("engine") else ""
        lines.append(f"  perplexity on {ev['tokens']} tokens of {ev['text']} ({ev['windows']} windows of "
                     f"{ev['window_tokens']}{engine}):")
        p = report["perplexity"]
        lines.append(f"    {'source model (reference)':<34} {_ppl(p['source'])}")
        lines.append(f"    {'exported':<34} {_ppl(p['exported'])}  " +
                     (f"{p['delta_pct']:+.2f}%" if p.get("delta_pct") is not None else ""))
        base = report.get("baseline")
        if base:
            lines.append(f"    {base['scheme'] + ' (round-to-nearest)':<34} {base['perplexity']:>10.3f}  "
                         f"{base['delta_pct']:+.2f}%   same size: "
                         f"{'yes' if base['weight_bytes'] == base['calibrated_weight_bytes'] else 'no'} "
                         f"({_mib(base['weight_bytes'])} vs {_mib(base['calibrated_weight_bytes'])})")
        for s in report.get("sparsity", []):
            reached = f" (reached {s['measured']:.1%})" if s.get("measured") is not None else ""
            label = f"sparsity {s['target']:.0%}{reached}"
            lines.append(f"    {label:<34} {s['perplexity']:>10.3f}  {s['delta_pct']:+.2f}% vs exported "
                         f"({s.get('dense_perplexity', '?')} on the first {s.get('tokens', '?')} tokens)")
        for t in (report.get("texts") or [])[1:]:
            q = t["perplexity"]
            lines.append(f"    on {t['tokens']} tokens of {t['text']}: source {q['source']:.3f}, exported "
                         f"{q['exported']:.3f}  {q['delta_pct']:+.2f}%")
    else:
        lines.append("  (no perplexity evaluation)")
    sizes = report.get("size_by_role")
    if sizes:
        total = report.get("bundle_bytes") or sum(sizes.values())
        lines.append("  size by role: " + ", ".join(f"{k} {_mib(v)}" for k, v in sizes.items() if v)
                     + f"; total {_mib(total)}")
    fallbacks = report.get("fallbacks") or []
    if fallbacks:
        pairs: dict[str, int] = {}
        for f in fallbacks:
            key = f"{f['from']} -> {f['to']} ({f['reason']})"
            pairs[key] = pairs.get(key, 0) + 1
        lines.append(f"  fallbacks ({len(fallbacks)} tensors):")
        lines += [f"    {n} x {k}" for k, n in pairs.items()]
    rows = report.get("tensors") or []
    measured = [t for t in rows if t.get("sqnr_db") is not None]
    if measured:
        by_role: dict[str, list[float]] = {}
        for t in measured:
            if len(t["shape"]) > 1:
                by_role.setdefault(t["role"], []).append(t["sqnr_db"])
        if by_role:
            lines.append("  SQNR by role (dB, min / mean): " + ", ".join(
                f"{r} {min(v):.1f} / {sum(v) / len(v):.1f}" for r, v in by_role.items()))
    elif rows:
        lines.append("  every tensor is a bit-exact copy of the source")
    if tensors and rows:
        lines.append(f"  {'tensor':<32} {'format':<7} {'method':<9} {'SQNR dB':>8} {'weighted':>9}")
        for t in rows:
            lines.append(f"  {t['name']:<32} {t['format']:<7} {t['method']:<9} {_db(t.get('sqnr_db')):>8} "
                         f"{_db(t.get('weighted_sqnr_db')):>9}")
    timings = report.get("timings_s")
    if timings:
        total = report.get("total_s")
        if total:  # stages overlap: the total is measured on its own
            lines.append(f"  time: {total['wall']:.1f} s wall, {total['cpu']:.1f} s CPU; by stage (wall s, overlapping): "
                         + ", ".join(f"{k} {v:.1f}" for k, v in timings.items()))
        else:
            cpu = report.get("cpu_s") or {}
            lines.append(f"  time (wall s, cpu s): total {sum(timings.values()):.1f}, {sum(cpu.values()):.1f}; "
                         + ", ".join(f"{k} {v:.1f}" + (f"/{cpu[k]:.1f}" if k in cpu else "") for k, v in timings.items()))
    if report.get("peak_rss_bytes"):
        lines.append(f"  peak memory (RSS) of the export: {_mib(report['peak_rss_bytes'])}")
    return lines


def _ppl(v: float | None) -> str:
    return f"{v:>10.3f}" if v is not None else f"{'(not finite)':>10}"


def _db(v: float | None) -> str:
    return "exact" if v is None else f"{v:.1f}"
