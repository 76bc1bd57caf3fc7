"""Calibration: run the source model over calibration text and derive what the bundle stores.

From one pass of the unquantized model (RecordingOps) over the calibration windows:
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
import torch
from edgeflash.export.forward import final_hidden, head_tensor
from edgeflash.export.ops import RecordingOps, activation
from edgeflash.export.progress import bar
from edgeflash.runtime.bundle.packed import pack_array
from edgeflash.runtime.source import ModelSource


@dataclass
class Predictor:
    layer: int
    a: np.ndarray  # [rank, d_model] float32
    b: np.ndarray  # [d_ff, rank] float32
    threshold: float  # neuron predicted active when |act(b @ a @ x)| > threshold
    recall: float  # on calibration tokens held out from the fit
    precision: float
    predicted_active: float  # fraction of neurons predicted active


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
    spec = source.spec
    ops = RecordingOps(spec.n_layers, keep_ffn_inputs=predictor_rank > 0, threads=threads)
    head = head_tensor(source)
    for ids in bar(windows, "calibrate: forward", progress, unit="window"):
        hidden = final_hidden(source, ops, ids)
        ops.record_input(head.name, hidden)  # the head's input, without computing 262k logits
    ops.release()
    importance = ops.importance()

    targets = sorted({float(s) for s in sparsity_targets})
    mid = targets[len(targets) // 2]
    act_thr = np.zeros((spec.n_layers, len(targets)))
    gate_thr = np.zeros((spec.n_layers, len(targets)))
    order, freq, predictors = [], [], []
    for layer in bar(range(spec.n_layers), "calibrate: thresholds", progress, unit="layer"):
        g = np.concatenate(ops.gate_pre[layer]).astype(np.float32)  # [T, d_ff]
        a = np.abs(activation(g, spec.activation))
        act_thr[layer] = np.quantile(a, targets)
        gate_thr[layer] = np.quantile(np.abs(g), targets)
        active = a > act_thr[layer, targets.index(mid)]
        f = active.mean(axis=0).astype(np.float32)  # [d_ff]
        freq.append(f)
        order.append(np.argsort(-f, kind="stable").astype(np.int32))
        if predictor_rank > 0:
            x = np.concatenate(ops.ffn_inputs[layer]).astype(np.float32)  # [T, d_model]
            gate_w = _dense(source, f"blk.{layer}.ffn_gate.weight")
            predictors.append(fit_predictor(layer, x, active, gate_w, spec.activation, predictor_rank,
                                            predictor_recall, act_thr[layer, targets.index(mid)]))
        ops.gate_pre[layer] = []
        if ops.ffn_inputs is not None:
            ops.ffn_inputs[layer] = []

    counts = np.bincount(np.asarray(frequency_ids, dtype=np.int64), minlength=spec.vocab_size)[:spec.vocab_size]
    ranked = np.argsort(-counts, kind="stable")[:top_tokens]
    ranked = ranked[counts[ranked] > 0]
    return Calibration(
        text_source=text_source, tokens=sum(len(w) for w in windows), windows=len(windows),
        window_tokens=window_tokens, importance=importance, sparsity_targets=targets,
        act_thresholds=act_thr, gate_thresholds=gate_thr, frequency_sparsity=mid,
        neuron_order=order, neuron_frequency=freq, top_token_ids=ranked.astype(np.int64),
        top_token_counts=counts[ranked].astype(np.int64), frequency_tokens=len(frequency_ids),
        predictor_rank=predictor_rank, predictors=predictors)


def _dense(source: ModelSource, name: str) -> np.ndarray:
    from edgeflash.export.quant.methods import dequantize_matrix

    t = source.tensors[name]
    return dequantize_matrix(t.raw, t.fmt, t.cols).reshape(t.shape)


def fit_predictor(layer: int, x: np.ndarray, active: np.ndarray, gate_w: np.ndarray, act: str, rank: int,
                  target_recall: float, act_threshold: float) -> Predictor:
    """Rank-r predictor of the gate pre-activations: g ~ B (A x), the best rank-r approximation
    of gate_w under the calibration inputs' covariance C = L L^T (truncated SVD of L^T gate_w^T,
    so the error is measured on the inputs the layer actually sees). The first 3/4 of the
    tokens fit it and pick the threshold for `target_recall`; the last 1/4 measures it.

    x: [T, d_model]; active: [T, d_ff] bool (|act(gate x)| > act_threshold); gate_w: [d_ff, d_model]."""
    split = max(1, int(len(x) * 0.75))
    fit_x, test_x = torch.from_numpy(x[:split].astype(np.float64)), x[split:]
    d = x.shape[1]
    cov = fit_x.T @ fit_x / len(fit_x) + 1e-6 * torch.eye(d, dtype=torch.float64)  # [d, d]
    chol = torch.linalg.cholesky(cov)  # cov = L L^T
    z = (chol.T @ torch.from_numpy(gate_w.T.astype(np.float64))).numpy()  # [d, d_ff]: gate map on whitened inputs
    r = min(rank, d)
    u = _top_eigenvectors(z @ z.T, r)  # [d, r]: top left singular vectors of z
    a = torch.linalg.solve_triangular(chol.T, torch.from_numpy(u), upper=True).numpy().T  # [r, d] = (L^-T U_r)^T
    b = z.T @ u  # [d_ff, r] = V_r S_r
    a32, b32 = a.astype(np.float16).astype(np.float32), b.astype(np.float16).astype(np.float32)  # as stored

    def predicted_magnitude(inputs: np.ndarray) -> np.ndarray:
        return np.abs(activation((inputs.astype(np.float32) @ a32.T) @ b32.T, act))  # [T, d_ff]

    fit_pred = predicted_magnitude(x[:split])
    truly = active[:split]
    # threshold: the (1 - recall) quantile of the predicted magnitude over truly active neurons
    thr = float(np.quantile(fit_pred[truly], 1.0 - target_recall)) if truly.any() else float(act_threshold)
    test_active = active[split:] if len(test_x) else truly
    test_pred = predicted_magnitude(test_x) > thr if len(test_x) else fit_pred > thr
    tp = float(np.logical_and(test_pred, test_active).sum())
    recall = tp / max(float(test_active.sum()), 1.0)
    precision = tp / max(float(test_pred.sum()), 1.0)
    return Predictor(layer=layer, a=a32, b=b32, threshold=thr, recall=recall, precision=precision,
                     predicted_active=float(test_pred.mean()))


def _top_eigenvectors(m: np.ndarray, r: int, iterations: int = 8) -> np.ndarray:
    """Top-r eigenvectors of a symmetric PSD matrix by subspace iteration (a fixed-seed randomized
    range finder): a few [d, r]-wide products instead of a full eigendecomposition."""
    d = m.shape[0]
    k = min(d, r + 16)
    q, _ = np.linalg.qr(m @ np.random.default_rng(0).standard_normal((d, k)))
    for _ in range(iterations):
        q, _ = np.linalg.qr(m @ q)
    _, vecs = np.linalg.eigh(q.T @ m @ q)  # [k, k]
    return q @ vecs[:, ::-1][:, :r]
