"""Per-layer calibration statistics, from one layer's pass over the calibration windows.

- sparsity thresholds per target sparsity s: the magnitude t with a fraction s of all neuron
  activations |act(gate . x)| <= t (CATS), and the same quantile of |gate . x| itself (the
  pre-activation criterion the native sparse-FFN kernel tests);
- the hot-first neuron order: neurons sorted by how often they are active (|act| above the
  layer's threshold at the middle target sparsity);
- a low-rank predictor of the gate pre-activations from the FFN input;
- token frequencies of the calibration text (the self-draft head's vocabulary).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from edgeflash.export.torch_ops import activate


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
class LayerCalibration:
    """What one layer's calibration pass yields."""

    layer: int
    importance: dict[str, np.ndarray]  # tensor name -> E[x^2] per input column
    act_thresholds: np.ndarray  # [n_targets]
    gate_thresholds: np.ndarray  # [n_targets]
    frequency: np.ndarray  # [d_ff] float32: fraction of tokens on which each neuron is active
    order: np.ndarray  # [d_ff] int32, hot first
    predictor: Predictor | None
    output_importance: np.ndarray | None = None  # [d_model]: E[x^2] of the output through the next norm


def layer_statistics(layer: int, gate_pre: torch.Tensor, ffn_inputs: torch.Tensor | None, gate_w: np.ndarray | None,
                     activation_kind: str, targets: list[float], predictor_rank: int,
                     predictor_recall: float = 0.9) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray,
                                                              Predictor | None]:
    """(act thresholds, gate thresholds, neuron frequency, hot-first order, predictor) of one layer
    from its gate pre-activations `[T, d_ff]` (and FFN inputs `[T, d_model]`, gate weights
    `[d_ff, d_model]` for the predictor). Quantiles are order statistics (np.partition: linear
    time, where sorting 40M values per layer was the slowest part of calibrating a 7B model)."""
    g = gate_pre.float()  # [T, d_ff]
    a = activate(g, activation_kind).abs_()
    act_thr = _quantiles(a.numpy(), targets)
    gate_thr = _quantiles(g.abs().numpy(), targets)
    mid = targets[len(targets) // 2]
    active = a > float(act_thr[targets.index(mid)])  # [T, d_ff]
    freq = active.float().mean(dim=0).numpy().astype(np.float32)
    order = np.argsort(-freq, kind="stable").astype(np.int32)
    predictor = None
    if predictor_rank > 0 and ffn_inputs is not None and gate_w is not None:
        predictor = fit_predictor(layer, ffn_inputs.float().numpy(), active.numpy(), gate_w, activation_kind,
                                  predictor_rank, predictor_recall, float(act_thr[targets.index(mid)]))
    return act_thr, gate_thr, freq, order, predictor


QUANTILE_SAMPLE = 1 << 21  # values a quantile is taken over (evenly spaced; a 7B layer has 40M)


def _quantiles(values: np.ndarray, qs: list[float], sample: int = QUANTILE_SAMPLE) -> np.ndarray:
    """The q-quantiles of the values, as the k-th smallest (k = q * (n - 1), rounded), over an
    evenly spaced sample of at most `sample` of them (thresholds move by well under 1% from it)."""
    flat = values.reshape(-1)
    if flat.size > sample:
        flat = flat[::-(-flat.size // sample)].copy()
    ks = sorted({min(flat.size - 1, max(0, round(q * (flat.size - 1)))) for q in qs})
    part = np.partition(flat, ks)
    return np.array([part[min(flat.size - 1, max(0, round(q * (flat.size - 1))))] for q in qs], dtype=np.float64)


def token_frequencies(frequency_ids: list[int], vocab_size: int, top_tokens: int) -> tuple[np.ndarray, np.ndarray]:
    """(ids, counts) of the most frequent tokens, most frequent first, only tokens that occurred."""
    counts = np.bincount(np.asarray(frequency_ids, dtype=np.int64), minlength=vocab_size)[:vocab_size]
    ranked = np.argsort(-counts, kind="stable")[:top_tokens]
    ranked = ranked[counts[ranked] > 0]
    return ranked.astype(np.int64), counts[ranked].astype(np.int64)


def fit_predictor(layer: int, x: np.ndarray, active: np.ndarray, gate_w: np.ndarray, act: str, rank: int,
                  target_recall: float, act_threshold: float) -> Predictor:
    """Rank-r predictor of the gate pre-activations: g ~ B (A x), the best rank-r approximation
    of gate_w under the calibration inputs' covariance C = L L^T (truncated SVD of z = L^T gate_w^T,
    so the error is measured on the inputs the layer actually sees). The first 3/4 of the
    tokens fit it and pick the threshold for `target_recall`; the last 1/4 measures it.

    The SVD is a randomized subspace iteration that only multiplies by z and z^T (products with
    gate_w and L): forming z z^T costs d_model^2 x d_ff, 0.5 TFLOP a layer for a 7B model.

    x: [T, d_model]; active: [T, d_ff] bool (|act(gate x)| > act_threshold); gate_w: [d_ff, d_model]."""
    split = max(1, int(len(x) * 0.75))
    test_x = x[split:]
    d = x.shape[1]
    fit = torch.from_numpy(np.ascontiguousarray(x[:split], dtype=np.float32))
    cov = (fit.T @ fit).double() / len(fit)  # [d, d]; fewer tokens than dimensions leave it singular
    jitter = 1e-5 * float(cov.diagonal().mean()) + 1e-8
    while True:  # the smallest ridge that makes it positive definite (float32 products round a little)
        chol, info = torch.linalg.cholesky_ex(cov + jitter * torch.eye(d, dtype=torch.float64))  # cov = L L^T
        if int(info) == 0:
            break
        jitter *= 10
    lt = chol.T.float().contiguous()  # L^T [d, d]
    g = torch.from_numpy(np.ascontiguousarray(gate_w, dtype=np.float32))  # [d_ff, d]

    def z(m: torch.Tensor) -> torch.Tensor:  # z @ m = L^T gate_w^T m: [d, k]
        return lt @ (g.T @ m)

    def zt(m: torch.Tensor) -> torch.Tensor:  # z^T @ m = gate_w L m: [d_ff, k]
        return g @ (lt.T @ m)

    r = min(rank, d)
    k = min(d, r + 16)
    q, _ = torch.linalg.qr(z(torch.from_numpy(np.random.default_rng(0).standard_normal((g.shape[0], k))
                                              .astype(np.float32))))
    for _ in range(2):  # two power iterations with 16 extra directions: the top 64 settle (rank 64 of 1536)
        q, _ = torch.linalg.qr(z(zt(q)))
    small = zt(q)  # [d_ff, k] = z^T Q; z ~ Q (Q^T z)
    u_small, _, _ = torch.linalg.svd(small.T, full_matrices=False)  # Q^T z = U S V^T
    u = (q @ u_small[:, :r]).double()  # [d, r]: top left singular vectors of z
    a = torch.linalg.solve_triangular(chol.T, u, upper=True).T.float().numpy()  # [r, d] = (L^-T U_r)^T
    b = zt(u.float()).numpy()  # [d_ff, r] = z^T U_r = V_r S_r
    a32, b32 = a.astype(np.float16).astype(np.float32), b.astype(np.float16).astype(np.float32)  # as stored

    def predicted_magnitude(inputs: np.ndarray) -> np.ndarray:
        t = torch.from_numpy(np.ascontiguousarray(inputs, dtype=np.float32))
        return activate((t @ torch.from_numpy(a32).T) @ torch.from_numpy(b32).T, act).abs_().numpy()  # [T, d_ff]

    rows = slice(None, None, max(1, split // 256))  # the threshold from about 256 of the fit tokens
    fit_pred = predicted_magnitude(x[:split][rows])
    truly = active[:split][rows]
    # threshold: the (1 - recall) quantile of the predicted magnitude over truly active neurons
    thr = float(_quantiles(fit_pred[truly], [1.0 - target_recall])[0]) if truly.any() else float(act_threshold)
    test_active = active[split:] if len(test_x) else truly
    test_pred = predicted_magnitude(test_x) > thr if len(test_x) else fit_pred > thr
    tp = float(np.logical_and(test_pred, test_active).sum())
    recall = tp / max(float(test_active.sum()), 1.0)
    precision = tp / max(float(test_pred.sum()), 1.0)
    return Predictor(layer=layer, a=a32, b=b32, threshold=thr, recall=recall, precision=precision,
                     predicted_active=float(test_pred.mean()))
