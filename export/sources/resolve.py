"""Any export source -> ModelSource: a path or alias, a ModelSource, or a torch nn.Module."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from edgeflash.base.errors import UserError
from edgeflash.runtime.source import ModelSource


def load_source(source: Any, config: Any = None, tokenizer: Any = None) -> ModelSource:
    if isinstance(source, ModelSource):
        return source
    if isinstance(source, (str, Path)):
        if config is not None or tokenizer is not None:
            raise UserError("config= and tokenizer= apply to torch module sources only; a path carries its own")
        from edgeflash.base.models import resolve_model
        from edgeflash.runtime.sources import open_model

        return open_model(resolve_model(source))
    try:
        import torch
    except ImportError:
        torch = None
    if torch is not None and isinstance(source, torch.nn.Module):
        from edgeflash.export.sources.torch_module import load_torch_module

        return load_torch_module(source, config, tokenizer)
    raise UserError(f"cannot export a {type(source).__name__}: expected a GGUF file, a Hugging Face directory, a "
                    "bundle, a model alias or a torch nn.Module")
