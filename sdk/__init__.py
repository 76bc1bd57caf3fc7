"""edgeflash: run language models on devices whose memory is smaller than the model.

    import edgeflash as ef
    m = ef.load("default")                   # Gemma 3 270M from its PyPI package
    print(m.generate("Hello", max_tokens=32).text)
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"
__all__ = ["load", "export", "Model", "GenerationResult", "UserError", "__version__"]


def __getattr__(name: str) -> Any:
    # Imported lazily so `import edgeflash.errors` (used everywhere) stays cheap.
    if name in ("load", "Model"):
        from edgeflash import api

        return getattr(api, name)
    if name == "GenerationResult":
        from edgeflash.runtime.generate import GenerationResult

        return GenerationResult
    if name == "UserError":
        from edgeflash.errors import UserError

        return UserError
    if name == "export":  # the edgeflash.export package, callable as export(source, out_dir, ...)
        import edgeflash.export

        return edgeflash.export
    raise AttributeError(f"module 'edgeflash' has no attribute {name!r}")
