"""SmolLM2 loaded and calibrated once for the export tests (small settings: tests stay fast)."""

from __future__ import annotations

import pytest

CALIBRATION_TOKENS = 256
EVAL_TOKENS = 512
WINDOW = 256


@pytest.fixture(scope="session")
def smol(smollm_path):
    from edgeflash.runtime.sources.gguf import load_gguf

    return load_gguf(smollm_path)


@pytest.fixture(scope="session")
def smol_calibration(smol):
    from edgeflash.export.calibrate import calibrate
    from edgeflash.export.corpus import calibration_text
    from edgeflash.export.text import token_windows

    text = calibration_text()
    windows = token_windows(smol.tokenizer, text, CALIBRATION_TOKENS, WINDOW, "calibration")
    return calibrate(smol, windows, text_source="test", window_tokens=WINDOW, sparsity_targets=[0.3, 0.5, 0.7],
                     frequency_ids=smol.tokenizer.encode(text[:100_000], add_bos=False), top_tokens=512,
                     predictor_rank=0, progress=False)


@pytest.fixture(scope="session")
def heldout_windows(smol):
    from edgeflash.export.corpus import heldout_text
    from edgeflash.export.text import token_windows

    return token_windows(smol.tokenizer, heldout_text(), EVAL_TOKENS, WINDOW, "held-out")


@pytest.fixture(scope="session")
def smol_source_perplexity(smol, heldout_windows):
    from edgeflash.export.evaluate import perplexity

    return perplexity(smol, heldout_windows)
