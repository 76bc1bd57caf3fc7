"""Whether a sparse FFN pays against exact flash, before anything is read.

A sparse FFN reads the bundles of the neurons a token's predictor flags and the window's cache
lacks, merged into runs of whole 4 KiB pages; exact flash reads every streamed unit whole, in large
reads. Reading half of the neurons as scattered pages can cost more than reading all of them in
large pieces, so the planner estimates both and keeps exact flash unless the sparse setting reads
clearly less. Measured tokens/s for the bundle and budget (`sparsity_profile`) override the
estimate.

The estimate, per layer, from the bundle's calibration (per-neuron activation frequency, arena
order): a neuron is needed by a token with probability p (its frequency, scaled so the layer's
mean is the fraction the predictor flags at that level), is missing from a window of k tokens with
probability p (1 - p)^k, and a page is read when any neuron on it is missing. Tokens are taken as
independent and every page read is priced as a small read: both lean against the sparse setting
(neighbouring tokens share more neurons, and neighbouring pages merge into longer reads), so the
estimate refuses only what does not pay by a margin; measured tokens/s decide the rest, and are
what `--ffn-sparsity auto` picks from.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

PAGE = 4096
# A scattered page read costs this many times a byte of a large streamed read (direct reads of 4 KiB
# against 1 MiB on a virtual disk: 120-250 MB/s against 1.2-2 GB/s); smaller is kinder to sparse.
SMALL_READ_PENALTY = 4.0
# Chunk-aware reads (whole chunks of 64 KiB and more, neighbours merged) come close to streamed
# reads; an estimate, until tokens/s measured for the bundle and budget decide.
CHUNK_READ_PENALTY = 1.5
# Sparse mode must read less than this share of what exact flash reads to be chosen: both estimates
# ignore compute, and sparse mode adds the predictor's.
PAYS_BELOW = 0.8


@dataclass
class SparseLayerGeometry:
    frequency: np.ndarray  # [n_neurons] activation frequency per neuron, in arena slot order
    stride: int  # bytes between neighbouring neurons' bundles in the file
    offset: int  # file offset of arena slot 0


def neuron_probabilities(frequency: np.ndarray, active_fraction: float) -> np.ndarray:
    """Per-neuron chance of being flagged for a token: the calibration frequencies scaled so that
    their mean is the predictor's flagged fraction."""
    f = np.clip(np.asarray(frequency, dtype=np.float64), 0.0, 1.0)
    mean = f.mean() if f.size else 0.0
    if mean <= 0:
        return np.full(f.shape, min(1.0, active_fraction))
    return np.clip(f * (active_fraction / mean), 0.0, 1.0)


def expected_window_union(p: np.ndarray, window: int) -> float:
    """Neurons the cache must hold to keep the last `window` tokens' neurons and the current one's."""
    return float(np.sum(1.0 - (1.0 - p) ** (window + 1)))


def layer_read_bytes(geometry: SparseLayerGeometry, active_fraction: float, window: int, capacity: int) -> float:
    """Expected bytes one token reads for a layer's neurons (whole pages)."""
    p = neuron_probabilities(geometry.frequency, active_fraction)
    k = window
    while k > 0 and expected_window_union(p, k) > capacity:  # a smaller cache keeps a shorter window
        k -= 1
    miss = p * (1.0 - p) ** k
    n = p.size
    begins = geometry.offset + np.arange(n, dtype=np.int64) * geometry.stride
    first_page = begins // PAGE
    last_page = (begins + geometry.stride - 1) // PAGE
    pages = np.unique(np.concatenate([first_page, last_page]))
    # P(page not read) = product over the neurons on it of (1 - miss)
    log_keep = np.zeros(pages.size)
    log_miss = np.log1p(-np.minimum(miss, 1 - 1e-12))
    for span in range(int((last_page - first_page).max()) + 1 if n else 0):
        touched = first_page + span
        on = touched <= last_page
        np.add.at(log_keep, np.searchsorted(pages, touched[on]), log_miss[on])
    return float(np.sum(1.0 - np.exp(log_keep)) * PAGE)


def neuron_read_bytes(layers: list[SparseLayerGeometry], active_fraction: list[float], window: int,
                      capacity: int) -> float:
    """Expected neuron bytes one token reads over all layers."""
    return sum(layer_read_bytes(g, a, window, capacity) for g, a in zip(layers, active_fraction))


@dataclass
class FfnChoice:
    sparse: bool
    reason: str


def choose_ffn(exact_stream_bytes: int, sparse_stream_bytes: int, neuron_bytes: float,
               measured: dict[str, float] | None = None, penalty: float = SMALL_READ_PENALTY) -> FfnChoice:
    """Sparse or exact FFN for one bundle and budget. `exact_stream_bytes`: what exact flash streams
    a token; `sparse_stream_bytes`: what the sparse plan streams besides neurons; `neuron_bytes`:
    the estimate above; `measured`: tokens/s of {"exact": .., "sparse": ..} at this budget, when
    known (they decide); `penalty`: what a byte of neuron reads costs against a streamed byte."""
    if measured and measured.get("exact") and measured.get("sparse") is not None:
        if measured["sparse"] > measured["exact"]:
            return FfnChoice(True, f"measured {measured['sparse']:.2f} tok/s against exact flash's "
                                   f"{measured['exact']:.2f}")
        return FfnChoice(False, f"it measured {measured['sparse']:.2f} tok/s against exact flash's "
                                f"{measured['exact']:.2f} at this budget")
    sparse_cost = sparse_stream_bytes + penalty * neuron_bytes
    if sparse_cost < PAYS_BELOW * exact_stream_bytes:
        return FfnChoice(True, f"estimated {sparse_cost / 1e6:.1f} MB-equivalent a token against exact flash's "
                               f"{exact_stream_bytes / 1e6:.1f} MB")
    return FfnChoice(False, f"it would read about {sparse_stream_bytes / 1e6:.1f} MB + {neuron_bytes / 1e6:.1f} MB of "
                            f"neurons (worth {sparse_cost / 1e6:.1f} MB of large reads) a token "
                            f"against exact flash's {exact_stream_bytes / 1e6:.1f} MB")
