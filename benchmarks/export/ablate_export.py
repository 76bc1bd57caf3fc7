"""Which part of the streaming exporter moves a model's perplexity: export it once per variant, each
variant undoing one choice of the exporter, and evaluate every bundle on the same held-out windows.

    python benchmarks/export/ablate_export.py --model gemma3-270m --variants current dense-rows down-q5_0

Variants (each changes one thing against `current`, the exporter as it is):
- f32-calibration: calibration products in float32 instead of bfloat16 with float32 accumulation;
- exact-quantiles: sparsity quantiles over every gate value instead of an evenly spaced sample;
- dense-rows: no neuron arena (`neuron_arena=False`): the FFN as dense matrices, down in rows of
  d_ff values weighted by E[act^2] (the earlier exporter's dense copy);
- down-unweighted: the arena's down columns quantized without output weights;
- down-gains: down columns weighted by the squared gains of the norms their output passes;
- down-q5_0 / down-q8_0: down columns in q5_0 / q8_0 in every layer; down-q8_0-more-bits: q8_0
  in the layers llama.cpp's Q4_K_M gives more bits in ffn_down (the first and last eighth, every
  third between), q5_0 elsewhere; down-q8_0-three-quarters: q8_0 in every layer but every third
  one of the middle (the exporter's own rule).
Bundles are evaluated like compare_exports.py does (native engine, teacher forcing, the source
model beside them). Results go to --out as JSON and to benchmarks/results/export-scale.jsonl, one
record per value, config "variant <name>".
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

HERE = Path(__file__).resolve().parent


@contextmanager
def _patched(obj: object, name: str, value: object) -> Iterator[None]:
    before = getattr(obj, name)
    setattr(obj, name, value)
    try:
        yield
    finally:
        setattr(obj, name, before)


@contextmanager
def f32_calibration() -> Iterator[None]:
    import numpy as np
    import torch
    from edgeflash.export import torch_ops

    def weight(self, t):
        w = self._weights.get(t.name)
        if w is None:
            with self._lock:
                w = self._weights.get(t.name)
                if w is None:
                    w = torch.from_numpy(np.ascontiguousarray(torch_ops.dense_values(t)))
                    self._weights[t.name] = w
        return w

    def linear(self, x, w, bias=None):
        y = x.float() @ self.weight(w).T
        return y + self.weight(bias) if bias is not None else y

    with _patched(torch_ops.TorchOps, "weight", weight), _patched(torch_ops.TorchOps, "linear", linear):
        yield


@contextmanager
def exact_quantiles() -> Iterator[None]:
    from edgeflash.export import statistics

    with _patched(statistics, "QUANTILE_SAMPLE", 1 << 62):
        defaults = list(statistics._quantiles.__defaults__)
        defaults[0] = 1 << 62
        with _patched(statistics._quantiles, "__defaults__", tuple(defaults)):
            yield


@contextmanager
def down_unweighted() -> Iterator[None]:
    from edgeflash.export import layerwise

    with _patched(layerwise.LayerwiseRunner, "_output_importance", lambda self, layer: None):
        yield


@contextmanager
def down_gains() -> Iterator[None]:
    """Down columns weighted by how much an error in each output dimension reaches the next reader:
    the squared gains of the norms it passes (Gemma 3's post-FFN norm, then the next input norm)."""
    import numpy as np
    from edgeflash.export import layerwise

    def gains(self, layer):
        t = self.source.tensors
        nxt = f"blk.{layer + 1}.attn_norm.weight" if layer + 1 < self.spec.n_layers else "output_norm.weight"
        w = layerwise.dense_values(t[nxt]).astype(np.float64) ** 2
        post = f"blk.{layer}.post_ffw_norm.weight"
        if post in t:
            w = w * layerwise.dense_values(t[post]).astype(np.float64) ** 2
        return w

    with _patched(layerwise.LayerwiseRunner, "_output_importance", gains):
        yield


def more_bits_layer(layer: int, n_layers: int) -> bool:
    """The layers llama.cpp's Q4_K_M gives more bits in ffn_down: the first and last eighth and every
    third one between."""
    return layer < n_layers // 8 or layer >= 7 * n_layers // 8 or (layer - n_layers // 8) % 3 == 2


def down_format(fmt: str, layers: Callable[[int, int], bool]) -> Callable[[], object]:
    @contextmanager
    def apply() -> Iterator[None]:
        import dataclasses

        from edgeflash.export import partition, pipeline

        plan = partition.plan_layout

        def planned(source, config, layout, predictor_rank):
            blocks = plan(source, config, layout, predictor_rank)
            for b in blocks:
                if b.arena is not None and layout == "arena" and layers(b.arena.layer, source.spec.n_layers):
                    b.arena = dataclasses.replace(b.arena, down_fmt=fmt)
            return blocks

        with _patched(pipeline, "plan_layout", planned):
            yield

    return apply


def all_but_middle_thirds(layer: int, n_layers: int) -> bool:
    """Every layer but every third one of the middle (the first and last eighth all included)."""
    return layer < n_layers // 8 or layer >= 7 * n_layers // 8 or (layer - n_layers // 8) % 3 != 0


@contextmanager
def nothing() -> Iterator[None]:
    yield


# name -> (context that applies it, extra export options)
VARIANTS: dict[str, tuple[Callable[[], object], dict]] = {
    "current": (nothing, {}),
    "f32-calibration": (f32_calibration, {}),
    "exact-quantiles": (exact_quantiles, {}),
    "dense-rows": (nothing, {"neuron_arena": False}),
    "down-unweighted": (down_unweighted, {}),
    "down-gains": (down_gains, {}),
    "down-q5_0": (down_format("q5_0", lambda layer, n: True), {}),
    "down-q8_0": (down_format("q8_0", lambda layer, n: True), {}),
    "down-q8_0-more-bits": (down_format("q8_0", more_bits_layer), {}),
    "down-q8_0-three-quarters": (down_format("q8_0", all_but_middle_thirds), {}),
}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="gemma3-270m")
    p.add_argument("--quant", default="q4_0")
    p.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    p.add_argument("--eval-tokens", type=int, default=1024)
    p.add_argument("--work", type=Path, default=Path("bench-out/ablate"))
    p.add_argument("--out", type=Path, default=Path("bench-out/ablate_export.json"))
    args = p.parse_args()
    sys.path.insert(0, str(HERE))
    from compare_exports import evaluate
    from edgeflash.export import export

    runs, bundles = {}, {}
    for name in args.variants:
        patch, options = VARIANTS[name]
        out = args.work / f"{Path(args.model).stem}-{name}"
        start = time.perf_counter()
        with patch():
            export(args.model, out, args.quant, overwrite=True, progress=False, eval_tokens=0, **options)
        runs[name] = {"wall_s": round(time.perf_counter() - start, 1)}
        bundles[name] = out
        print(f"{args.model} {name}: exported in {runs[name]['wall_s']} s", flush=True)
    ppl = evaluate(args.model, bundles, args.eval_tokens)
    for text, row in ppl.items():
        print(f"perplexity on {text}: " + ", ".join(f"{k} {v}" for k, v in row.items()), flush=True)
    results = {"model": args.model, "quant": args.quant, "time": time.time(), "runs": runs, "perplexity": ppl}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1))
    record(results, " ".join(["benchmarks/export/ablate_export.py", *sys.argv[1:]]))


def record(results: dict, command: str) -> None:
    from records import new_run_id, record_values

    run = new_run_id()
    for name, r in results["runs"].items():
        values = {"wall_s": r["wall_s"]}
        for text, row in results["perplexity"].items():
            values[f"perplexity:{text}"] = row[name]
            values[f"perplexity:{text}:source"] = row["source"]
        config = f"variant {name}, {results['quant']}"
        record_values(run, Path(results["model"]).stem, config, values, command,
                      notes="export() in one process per variant, no evaluation inside; wall with load")


if __name__ == "__main__":
    sys.exit(main())
