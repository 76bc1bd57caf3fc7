"""Exports of the two real models to the platform targets, made once per session and shared by
the test modules; the reference model on the same weights and its results, also shared.

Exports are kept small so the folder runs in minutes: a 64-token cache, 16-token prefill, and
round-to-nearest q4_0 (no calibration pass). ExecuTorch's lowering to XNNPACK costs several
seconds per layer and method, so its tests (and the Core ML ones) export the models' first two
layers with their real weights, embedding and head; the ONNX tests export the whole models, and
benchmarks/backends/ runs the whole models on every target (docs/backends.md).
"""

from __future__ import annotations

import pytest

CACHE_LEN = 64
PREFILL_TOKENS = 16
QUANT = "q4_0-rtn"


@pytest.fixture(scope="session")
def model_source():
    """source(alias, layers=None) -> ModelSource of the real model, or of its first `layers`
    layers (with its own embedding, final norm and head), loaded once."""
    from edgeflash.export.sources import load_source
    from target_checks import first_layers

    made: dict[tuple, object] = {}

    def source(alias: str, layers: int | None = None):
        if (alias, None) not in made:
            made[(alias, None)] = load_source(alias)
        if (alias, layers) not in made:
            made[(alias, layers)] = first_layers(made[(alias, None)], layers)
        return made[(alias, layers)]

    return source


@pytest.fixture(scope="session")
def target_export(tmp_path_factory, model_source):
    """make(alias, target, chunks, layers=None, **options) -> TargetResult, each made once."""
    from edgeflash.export.targets import export_target

    made: dict[tuple, object] = {}

    def make(alias: str, target: str, chunks: int = 1, layers: int | None = None, **options):
        key = (alias, target, chunks, layers, tuple(sorted(options.items())))
        if key not in made:
            out = tmp_path_factory.mktemp("targets") / f"{alias}-{target}-c{chunks}"
            made[key] = export_target(model_source(alias, layers), out, target, quant=QUANT, chunks=chunks,
                                      cache_len=CACHE_LEN, prefill_tokens=PREFILL_TOKENS, calibration_tokens=0,
                                      progress=False, **options)
        return made[key]

    return make


@pytest.fixture(scope="session")
def target_reference(model_source):
    """reference(alias, target, layers=None) -> (reference ModelSource on the target's weights,
    its ops (the target's activation rounding, or None), a results cache for parity.compare)."""
    from edgeflash.export.targets.parity import reference_model

    made: dict[tuple, tuple] = {}

    def reference(alias: str, target: str, layers: int | None = None):
        if (alias, target, layers) not in made:
            made[(alias, target, layers)] = (*reference_model(model_source(alias, layers), target, QUANT), {})
        return made[(alias, target, layers)]

    return reference
