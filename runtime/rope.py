"""Rotary position embedding frequencies for a layer, from the spec alone.

Every scaling scheme reduces to one inverse-frequency vector per layer kind, so kernels only
ever see `inv_freq` and positions.
"""

from __future__ import annotations

import math

import numpy as np
from edgeflash.base.errors import UnsupportedModelError
from edgeflash.runtime.spec import ModelSpec


def inv_frequencies(spec: ModelSpec, layer: int) -> np.ndarray:
    """`[rope_dim / 2]` float64 inverse frequencies for `layer`."""
    base = spec.rope_base(layer)
    inv = 1.0 / base ** (np.arange(0, spec.rope_dim, 2, dtype=np.float64) / spec.rope_dim)
    scaling = spec.rope_scaling
    if not scaling:
        return inv
    if scaling.get("layers") == "full" and spec.layer_kinds[layer] != "full":
        return inv
    kind = scaling.get("type")
    if kind == "linear":
        return inv / float(scaling["factor"])
    if kind == "factors":  # explicit per-frequency divisors (GGUF `rope_freqs`)
        return inv / np.asarray(scaling["factors"], dtype=np.float64)
    if kind == "llama3":
        return _llama3(inv, scaling)
    raise UnsupportedModelError(f"RoPE scaling type {kind!r} is not supported (linear, llama3, factors)")


def _llama3(inv: np.ndarray, s: dict) -> np.ndarray:
    # Llama 3.1: keep high frequencies, divide low ones by `factor`, blend in between.
    factor, low, high = float(s["factor"]), float(s["low_freq_factor"]), float(s["high_freq_factor"])
    old_ctx = float(s["original_max_position_embeddings"])
    wavelen = 2 * math.pi / inv
    scaled = np.where(wavelen > old_ctx / low, inv / factor, inv)
    smooth = (old_ctx / wavelen - low) / (high - low)
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= old_ctx / high) & (wavelen <= old_ctx / low)
    return np.where(medium, blended, scaled)
