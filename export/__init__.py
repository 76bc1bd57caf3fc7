"""edgeflash.export: turn a model into a bundle the runtime streams from flash.

    import edgeflash as ef
    result = ef.export("model.gguf", "out/model-q4_0", quant="q4_0")   # == edgeflash.export.export(...)
    print(result.report["perplexity"])

Stages (each usable on its own): load (`sources.load_source`) -> partition (`plan_layout`: every
block's place, from shapes) -> per layer: calibrate (`layerwise.LayerwiseRunner`), quantize
(`quantize_tensor`, configs in `edgeflash.export.quant`), write (`writer.BundleWriter`) -> verify ->
evaluate (`evaluate.perplexity`, on the native engine). See docs/export.md.
"""

from __future__ import annotations

import sys
import types
from typing import Any

__all__ = ["ExportOptions", "ExportResult", "export"]


def __getattr__(name: str) -> Any:
    # Lazy: importing the package must not pull in torch until an export actually runs.
    if name in ("export", "ExportResult", "ExportOptions"):
        from edgeflash.export import pipeline

        return getattr(pipeline, name)
    raise AttributeError(f"module 'edgeflash.export' has no attribute {name!r}")


class _CallableModule(types.ModuleType):
    """Importing this package binds `edgeflash.export` to the package itself, which would shadow
    the `ef.export(...)` function of the public API; calling the package runs the export instead."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        from edgeflash.export.pipeline import export

        return export(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
