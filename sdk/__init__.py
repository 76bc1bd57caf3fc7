"""edgeflash: run language models on devices whose memory is smaller than the model.

    import edgeflash as ef
    m = ef.load("default")                   # Gemma 3 270M from its PyPI package
    print(m.generate("Hello", max_tokens=32).text)

Importing edgeflash loads the runtime's code (numpy and the compiled kernels, never torch), so
that what `load(..., memory_budget=...)` allocates afterwards is the model's alone.
"""

from __future__ import annotations

from typing import Any

from edgeflash.api import Model, load
from edgeflash.errors import UserError
from edgeflash.runtime.generate import GenerationResult

__version__ = "0.1.0"
__all__ = ["load", "export", "Model", "GenerationResult", "UserError", "__version__"]


def __getattr__(name: str) -> Any:
    # The exporter needs torch for some sources: imported only when asked for. The package
    # edgeflash.export is callable: export(source, out_dir, quant=..., target=...).
    if name == "export":
        import edgeflash.export

        return edgeflash.export
    raise AttributeError(f"module 'edgeflash' has no attribute {name!r}")
