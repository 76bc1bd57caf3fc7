"""edgeflash: run language models on devices whose memory is smaller than the model.

    import edgeflash as ef
    m = ef.load("default")                   # the default chat model from its PyPI package
    print(m.generate("Hello", max_tokens=32).text)

Importing edgeflash loads the runtime's code (numpy and the compiled kernels, never torch), so
that what `load(..., memory_budget=...)` allocates afterwards is the model's alone. The public API,
CLI, server and exporter are imported on first use: every subpackage import runs this file
first, and `import edgeflash.runtime` on a device must not load them.
"""

from __future__ import annotations

import importlib
from typing import Any

import edgeflash.runtime.loader  # noqa: F401  (what a load needs, before any budget is measured)
from edgeflash.base import __version__
from edgeflash.base.errors import UserError

__all__ = ["load", "export", "Model", "GenerationResult", "SAMPLING_DEFAULTS", "UserError", "__version__"]

# name -> module that defines it; `export` is the callable package edgeflash.export.
_LAZY = {"load": "edgeflash.api", "Model": "edgeflash.api", "GenerationResult": "edgeflash.runtime.generate",
         "SAMPLING_DEFAULTS": "edgeflash.runtime.sampler", "export": None}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'edgeflash' has no attribute {name!r}")
    if name == "export":
        return importlib.import_module("edgeflash.export")
    return getattr(importlib.import_module(_LAZY[name]), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
