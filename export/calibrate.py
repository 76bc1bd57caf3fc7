"""Calibration: run the source model over calibration text and derive what the bundle stores.

The unquantized model runs on torch one layer at a time over the calibration windows
(edgeflash.export.layerwise), and each layer yields:
- importance: E[x^2] per input column of every matrix (weights the calibrated quantizers);
- sparsity thresholds per layer and target sparsity s: the magnitude t with a fraction s of
  all neuron activations |act(gate . x)| <= t (CATS), and the same quantile of |gate . x|
  itself (the pre-activation criterion the native sparse-FFN kernel tests);
- the hot-first neuron order: neurons sorted by how often they are active (|act| above the
  layer's threshold at the middle target sparsity);
- optional low-rank predictors of the gate pre-activations from the FFN input;
- token frequencies of the calibration text (the self-draft head's vocabulary).
Held-out text is never used here (edgeflash.export.corpus keeps the splits apart).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
from edgeflash.export.progress import bar
from edgeflash.export.statistics import LayerCalibration, Predictor, token_frequencies
from edgeflash.runtime.bundle.packed import pack_array
from edgeflash.runtime.source import ModelSource

__all__ = ["Calibration", "LayerCalibration", "Predictor", "calibrate"]


@dataclass
class Calibration:
    text_source: str
    tokens: int
    windows: int
    window_tokens: int
    importance: dict[str, np.ndarray]
    sparsity_targets: list[float]
    act_thresholds: np.ndarray  # [n_layers, n_targets]
    gate_thresholds: np.ndarray  # [n_layers, n_targets]
    frequency_sparsity: float
    neuron_order: list[np.ndarray]  # per layer [d_ff] int32, hot first
    neuron_frequency: list[np.ndarray]  # per layer [d_ff] float32 in neuron-id order
    top_token_ids: np.ndarray
    top_token_counts: np.ndarray
    frequency_tokens: int
    predictor_rank: int = 0
    predictors: list[Predictor] = field(default_factory=list)

    @classmethod
    def from_layers(cls, layers: list[LayerCalibration], *, text_source: str, tokens: int, windows: int,
                    window_tokens: int, importance: dict[str, np.ndarray], targets: list[float],
                    top_token_ids: np.ndarray, top_token_counts: np.ndarray, frequency_tokens: int,
                    predictor_rank: int) -> Calibration:
        return cls(text_source=text_source, tokens=tokens, windows=windows, window_tokens=window_tokens,
                   importance=importance, sparsity_targets=targets,
                   act_thresholds=np.stack([lc.act_thresholds for lc in layers]),
                   gate_thresholds=np.stack([lc.gate_thresholds for lc in layers]),
                   frequency_sparsity=targets[len(targets) // 2], neuron_order=[lc.order for lc in layers],
                   neuron_frequency=[lc.frequency for lc in layers], top_token_ids=top_token_ids,
                   top_token_counts=top_token_counts, frequency_tokens=frequency_tokens,
                   predictor_rank=predictor_rank,
                   predictors=[lc.predictor for lc in layers if lc.predictor is not None])

    def threshold_for(self, sparsity: float) -> list[float]:
        j = self.sparsity_targets.index(sparsity)
        return [float(t) for t in self.act_thresholds[:, j]]

    def to_manifest(self) -> dict[str, Any]:
        """The calibration section of manifest.json (neuron order lives with each arena)."""
        out: dict[str, Any] = {
            "text": {"source": self.text_source, "tokens": self.tokens, "windows": self.windows,
                     "window_tokens": self.window_tokens},
            "sparsity": {
                "targets": self.sparsity_targets,
                "act_threshold": _round(self.act_thresholds),
                "gate_threshold": _round(self.gate_thresholds),
                "criterion": "a neuron is inactive for a token when |act(gate . x)| <= act_threshold[layer][k] "
                             "(act = the family's SiLU or tanh-GELU); gate_threshold is the same quantile of "
                             "|gate . x| for kernels that test the pre-activation",
            },
            "neurons": {
                "frequency_sparsity": self.frequency_sparsity,
                # One packed array per layer: layers may differ in width.
                "frequency": [pack_array(np.round(f, 4), "float32") for f in self.neuron_frequency],
                "order": [pack_array(o, "int32") for o in self.neuron_order],
            },
            "token_frequencies": {"ids": pack_array(self.top_token_ids, "int32"),
                                  "counts": pack_array(self.top_token_counts, "int64"),
                                  "tokens_counted": self.frequency_tokens},
        }
        if self.predictors:
            out["predictors"] = {
                "rank": self.predictor_rank, "sparsity": self.frequency_sparsity,
                "rule": "neuron predicted active when |act(predictor_b @ (predictor_a @ x))| > threshold[layer]",
                "threshold": [round(p.threshold, 6) for p in self.predictors],
                "recall": [round(p.recall, 4) for p in self.predictors],
                "precision": [round(p.precision, 4) for p in self.predictors],
                "predicted_active": [round(p.predicted_active, 4) for p in self.predictors],
            }
        return out


def _round(a: np.ndarray) -> list[list[float]]:
    return [[float(f"{v:.6g}") for v in row] for row in a]


def calibrate(source: ModelSource, windows: list[list[int]], *, text_source: str, window_tokens: int,
              sparsity_targets: list[float], frequency_ids: list[int], top_tokens: int = 8192,
              predictor_rank: int = 0, predictor_recall: float = 0.9, progress: bool = True,
              threads: int = 1) -> Calibration:
    """The whole calibration of a model in memory (the streaming export does the same layer by
    layer between its writes): every layer run on torch over the windows, statistics per layer."""
    from edgeflash.export.layerwise import LayerwiseRunner

    targets = sorted({float(s) for s in sparsity_targets})
    runner = LayerwiseRunner(source, windows, keep_ffn_inputs=predictor_rank > 0, threads=threads)
    layers = []
    for layer in bar(range(source.spec.n_layers), "calibrate", progress, unit="layer"):
        layers.append(runner.calibrate_layer(layer, targets, predictor_rank, predictor_recall))
        runner.release_layer(layer)
    importance = {name: e for lc in layers for name, e in lc.importance.items()}
    importance.update(runner.head_importance())
    runner.close()
    ids, counts = token_frequencies(frequency_ids, source.spec.vocab_size, top_tokens)
    return Calibration.from_layers(layers, text_source=text_source, tokens=sum(len(w) for w in windows),
                                   windows=len(windows), window_tokens=window_tokens, importance=importance,
                                   targets=targets, top_token_ids=ids, top_token_counts=counts,
                                   frequency_tokens=len(frequency_ids), predictor_rank=predictor_rank)
