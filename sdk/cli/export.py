"""`edgeflash export`: quantize, partition, calibrate and write a verified bundle, or the same
model and quantization as an ExecuTorch, ONNX or Core ML export (--target)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from edgeflash.base.errors import UserError
from edgeflash.cli.args import non_negative_int, positive_int

HELP = "export a model to an edgeflash bundle, ExecuTorch, ONNX or Core ML"
DESCRIPTION = """Export SOURCE (a GGUF file, a Hugging Face directory or a model alias) to the bundle
directory OUT, one layer at a time: calibrate on text (code for a code model), quantize with
--quant, store each layer's FFN once as neuron arenas (dense and sparse reads both use them),
write 4 KiB-aligned checksummed blocks, and print a quality report (perplexity against the source
model on a few hundred held-out tokens; --full-report: both texts, each sparsity level and the
round-to-nearest baseline). The expected peak memory is printed first; an export that would not
fit in the memory available is refused.

schemes: keep, keep-arena, f16, q8_0, q4_0, q4_0-rtn, q4_1, q4_1-rtn, q5_0, q4_k, q3_k, q4_lut, q4_0-mixed,
  q4_lut-mixed, llama.cpp's names where they map (Q4_K_M, Q4_K_S, Q3_K_M, Q3_K_S, Q8_0, Q4_0, Q4_1, Q5_0,
  F16, F32),
  or mixed:ROLE=FORMAT[/METHOD][@GROUP],... with roles embedding, head, attention, ffn, norm, *

targets: bundle (default), executorch (.pte, XNNPACK), onnx (.onnx, onnxruntime),
  coreml (.mlpackage); the last three take q4_0, q8_0, f16, f32 or a mixed: scheme of them, --chunks, --cache-len, --prefill-tokens and --kv (pip install
  'edgeflash[backends]'); executorch also --et-activations f32 (exact, weight-only)

examples:
  edgeflash export default -o out/gemma-q4_0
  edgeflash export smollm2-135m -o out/smol-et --target executorch --quant q4_0-rtn --chunks 2
  edgeflash export smollm2-135m -o out/smol-keep --quant keep
  edgeflash export qwen2.5-coder-1.5b -o out/coder --quant keep-arena
  edgeflash export model.gguf -o out/m --quant mixed:attention=q8_0,ffn=q4_0 --calibration my.txt
  edgeflash export qwen2.5-coder-1.5b -o out/coder --quant Q4_K_M --full-report
"""


def _fractions(text: str) -> list[float]:
    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated fractions like 0.3,0.5,0.7, got {text!r}") from None
    if not values or any(not 0.0 < v < 1.0 for v in values):
        raise argparse.ArgumentTypeError(f"expected fractions strictly between 0 and 1, got {text!r}")
    return values


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("export", help=HELP, description=DESCRIPTION,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("source", metavar="SOURCE", help="GGUF file, Hugging Face directory, bundle, or alias")
    p.add_argument("-o", "--output", required=True, type=Path, metavar="OUT", help="bundle directory to write")
    p.add_argument("-q", "--quant", default="q4_0", metavar="SCHEME", help="quantization scheme (default: %(default)s)")
    p.add_argument("--quant-config", type=Path, metavar="FILE",
                   help="a QuantConfig as JSON (overrides --quant)")
    p.add_argument("--group-size", type=positive_int, default=None,
                   help="values per quantization scale; must match the formats' block size")
    p.add_argument("--target", default="bundle", help="bundle, executorch, onnx or coreml (default: %(default)s)")
    p.add_argument("--chunks", type=positive_int, default=None,
                   help="platform targets: split the layers into N files loaded one after another (default: 1)")
    p.add_argument("--cache-len", type=positive_int, default=None,
                   help="platform targets: KV-cache length = longest sequence (default: 1024)")
    p.add_argument("--prefill-tokens", type=positive_int, default=None,
                   help="platform targets: tokens per prefill call (default: 64)")
    p.add_argument("--kv", choices=("state", "io"), default=None,
                   help="platform targets: KV cache inside the program (state) or passed in and out (io)")
    p.add_argument("--et-activations", choices=("int8", "f32"), default=None, dest="et_activations",
                   help="executorch: int8 = XNNPACK's 8da4w/8da8w linear kernels (fast, default); f32 = "
                        "weight-only, float32 activations against the same codes (matches the reference "
                        "runtime to float rounding; slower, int4 codes a byte each)")
    p.add_argument("--calibration", type=Path, metavar="TEXTFILE",
                   help="calibration text (default: the shakespeare calibration split)")
    p.add_argument("--calibration-tokens", type=non_negative_int, default=None,
                   help="calibration tokens run through the model (default: 2048; platform targets 512, "
                        "0 = unweighted quantization)")
    p.add_argument("--eval-tokens", type=non_negative_int, default=None,
                   help="held-out tokens for perplexity; 0 skips evaluation (default: 512, 1024 with --full-report)")
    p.add_argument("--full-report", action="store_true",
                   help="evaluate on prose and code, at each sparsity level, and the round-to-nearest baseline")
    p.add_argument("--sparsity-eval-tokens", type=positive_int, default=512,
                   help="--full-report: held-out tokens for each sparsity level's perplexity (default: %(default)s)")
    p.add_argument("--window-tokens", type=positive_int, default=512, dest="window_tokens",
                   help="tokens per calibration/evaluation window (default: %(default)s)")
    p.add_argument("--window", type=positive_int, dest="window_tokens", help=argparse.SUPPRESS)  # earlier name
    p.add_argument("--sparsity-levels", type=_fractions, default=[0.3, 0.5, 0.7], dest="sparsity",
                   help="activation sparsities to calibrate thresholds for (default: 0.3,0.5,0.7)")
    p.add_argument("--sparsity", type=_fractions, dest="sparsity", help=argparse.SUPPRESS)  # earlier name
    p.add_argument("--no-memory-check", action="store_false", dest="check_memory",
                   help="export even when the expected peak memory exceeds what is available")
    p.add_argument("--no-neuron-arena", action="store_false", dest="neuron_arena",
                   help="store the FFN as dense matrices instead of neuron arenas (no sparse mode)")
    p.add_argument("--predictor-rank", type=non_negative_int, default=64,
                   help="rank of the low-rank neuron predictors; 0 = none (default: %(default)s)")
    p.add_argument("--top-tokens", type=positive_int, default=8192,
                   help="most frequent calibration tokens stored for self-drafting (default: %(default)s)")
    p.add_argument("--no-baseline", action="store_false", dest="baseline",
                   help="--full-report: skip the round-to-nearest baseline perplexity of calibrated schemes")
    p.add_argument("-t", "--threads", type=positive_int, default=2,
                   help="CPU threads (default: %(default)s)")
    p.add_argument("--ranks", type=positive_int, default=None, metavar="N",
                   help="write OUT/rank-0 .. rank-N-1, one bundle per rank of a tensor-parallel run (mpirun -n N "
                        "edgeflash generate -m OUT); copies the source's encoding, so -q does not apply")
    p.add_argument("-f", "--force", action="store_true", help="replace an existing bundle at OUT")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.add_argument("--tensors", action="store_true", help="list every tensor's format and SQNR in the report")
    p.add_argument("--json", action="store_true", help="end with the bundle summary as one JSON object")
    p.set_defaults(run=run)


# Options of the bundle target only: dest -> (flag, default). A platform target refuses them when
# set, so that no flag silently does nothing.
BUNDLE_ONLY = {"calibration": ("--calibration", None), "eval_tokens": ("--eval-tokens", None),
               "sparsity_eval_tokens": ("--sparsity-eval-tokens", 512), "window_tokens": ("--window-tokens", 512),
               "sparsity": ("--sparsity-levels", [0.3, 0.5, 0.7]), "neuron_arena": ("--no-neuron-arena", True),
               "full_report": ("--full-report", False), "check_memory": ("--no-memory-check", True),
               "predictor_rank": ("--predictor-rank", 64), "top_tokens": ("--top-tokens", 8192),
               "baseline": ("--no-baseline", True), "tensors": ("--tensors", False)}
PLATFORM_ONLY = ("chunks", "cache_len", "prefill_tokens", "kv", "et_activations")


def run(args: argparse.Namespace) -> int:
    from edgeflash.export import export
    from edgeflash.export.pipeline import check_target
    from edgeflash.runtime.bundle.describe import render, summary

    check_target(args.target)  # before any option check: an unknown target is the first thing to say
    if args.ranks is not None:
        if args.target != "bundle":
            raise UserError(f"--ranks: writes bundles, not --target {args.target}")
        from edgeflash.export.shard import export_shards

        export_shards(args.source, args.output, args.ranks, overwrite=args.force, progress=not args.quiet)
        return 0
    quant = _quant(args)
    if args.target != "bundle":
        return _run_platform(args, quant)
    if args.et_activations is not None:
        raise UserError("--et-activations: only for --target executorch, not bundle")
    given = [f"--{n.replace('_', '-')}" for n in PLATFORM_ONLY if getattr(args, n) is not None]
    if given:
        raise UserError(f"{', '.join(given)}: only for --target executorch, onnx or coreml, not bundle")
    if args.calibration_tokens == 0:
        raise UserError("--calibration-tokens 0: a bundle needs calibration tokens (an integer >= 1)")
    result = export(args.source, args.output, quant=quant, target=args.target,
                    calibration=args.calibration, calibration_tokens=args.calibration_tokens or 2048,
                    eval_tokens=args.eval_tokens, sparsity_eval_tokens=args.sparsity_eval_tokens,
                    window_tokens=args.window_tokens, sparsity_levels=args.sparsity,
                    neuron_arena=args.neuron_arena, predictor_rank=args.predictor_rank,
                    top_tokens=args.top_tokens, group_size=args.group_size, full_report=args.full_report,
                    baseline=args.baseline, check_memory=args.check_memory, overwrite=args.force,
                    progress=not args.quiet, threads=args.threads)
    out = sys.stdout
    out.write(render(result.manifest, blocks=False, tensors=args.tensors) + "\n")
    out.write(f"wrote {result.path}\n")
    if args.json:
        out.write(json.dumps(summary(result.manifest)) + "\n")
    return 0


def _quant(args: argparse.Namespace) -> object:
    quant: object = args.quant
    if args.quant_config is not None:
        from edgeflash.export.quant import QuantConfig

        try:
            quant = QuantConfig.from_json(args.quant_config.read_text(encoding="utf-8"))
        except OSError as e:
            raise UserError(f"{args.quant_config}: cannot read the quant config ({e.strerror})") from None
    return quant


def _run_platform(args: argparse.Namespace, quant: object) -> int:
    from edgeflash.export import export

    given = [flag for n, (flag, default) in BUNDLE_ONLY.items() if getattr(args, n) != default]
    if given:
        raise UserError(f"{', '.join(given)}: only for the bundle target, not --target {args.target}")
    if args.et_activations is not None and args.target != "executorch":
        raise UserError(f"--et-activations: only for --target executorch, not {args.target}")
    options = {n: getattr(args, n) for n in (*PLATFORM_ONLY, "calibration_tokens") if getattr(args, n) is not None}
    result = export(args.source, args.output, quant=quant, target=args.target, group_size=args.group_size,
                    overwrite=args.force, progress=not args.quiet, threads=args.threads, **options)
    m = result.manifest
    out = sys.stdout
    out.write(f"{m['target']} export of {m['model']['name']} ({m['quant']['scheme']}), "
              f"{len(m['chunks'])} chunk(s), cache {m['cache']['length']} tokens (kv={m['cache']['mode']}):\n")
    for c in m["chunks"]:
        parts = (["embedding"] if c["embedding"] else []) + [f"layers {c['layers'][0]}-{c['layers'][1] - 1}"] + (
            ["head"] if c["head"] else [])
        out.write(f"  {c['file']:<20} {c['bytes'] / 2**20:8.1f} MiB  {', '.join(parts)}\n")
    out.write(f"  total {m['total_bytes'] / 2**20:.1f} MiB; export {result.timings['total']:.0f} s\n")
    out.write(f"wrote {result.path}\n")
    if args.json:
        out.write(json.dumps({"target": m["target"], "path": str(result.path), "quant": m["quant"]["scheme"],
                              "total_bytes": m["total_bytes"], "cache": {k: m["cache"][k] for k in ("mode", "length")},
                              "chunks": [{k: c[k] for k in ("file", "bytes", "layers")} for c in m["chunks"]],
                              "timings_s": result.timings}) + "\n")
    return 0
