"""Shared pieces of the quality benchmarks: a model's calibration importance (E[x^2] per input
column of every matrix, as the exporter measures it) cached on disk, and held-out token windows."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from edgeflash.export.pipeline import choose_texts
from edgeflash.export.text import token_windows
from edgeflash.runtime.source import ModelSource

CALIBRATION_TOKENS = 2048
WINDOW_TOKENS = 512


def importance(model: ModelSource, cache: Path, threads: int = 2) -> dict[str, np.ndarray]:
    """E[x^2] per input column of every matrix on the model's calibration text (cached in `cache`)."""
    from edgeflash.export.layerwise import LayerwiseRunner

    if cache.exists():
        with np.load(cache) as z:
            return {k: z[k] for k in z.files}
    texts = choose_texts(model, None, False)
    windows = token_windows(model.tokenizer, texts.calibration, CALIBRATION_TOKENS, WINDOW_TOKENS, "calibration")
    runner = LayerwiseRunner(model, windows, keep_ffn_inputs=False, threads=threads)
    out: dict[str, np.ndarray] = {}
    for layer in range(model.spec.n_layers):
        out.update(runner.run_layer(layer).importance)
    out.update(runner.head_importance())
    runner.close()
    cache.parent.mkdir(parents=True, exist_ok=True)
    np.savez(cache, **out)
    return out


def heldout_windows(model: ModelSource, tokens: int) -> dict[str, list[list[int]]]:
    """{'prose': windows, 'code': windows}: `tokens` held-out tokens of each text, 512 per window."""
    texts = choose_texts(model, None, True)
    out = {}
    for description, text in texts.heldout:
        kind = "code" if "Python" in description else "prose"
        out[kind] = token_windows(model.tokenizer, text, tokens, WINDOW_TOKENS, f"held-out {kind}")
    return out
