"""A torch `nn.Module` (a Hugging Face-style causal LM) as a ModelSource.

The module's state_dict names are mapped through the family's `hf_tensor_name`, and its config
(a dict or a transformers config object) gives the ModelSpec, exactly as for a HF directory on
disk. A module carries no tokenizer, so one must be given: a Tokenizer, a tokenizer.json path, a
directory holding one, or a GGUF file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from edgeflash.base.errors import UserError
from edgeflash.runtime.source import ModelSource, expected_tensor_names
from edgeflash.runtime.tensors import Tensor


def config_dict(config: Any) -> dict[str, Any]:
    if isinstance(config, dict):
        return dict(config)
    if hasattr(config, "to_dict"):
        return config.to_dict()
    raise UserError(f"config must be a dict or a transformers config object, got {type(config).__name__}")


def resolve_tokenizer(tokenizer: Any):
    from edgeflash.runtime.tokenizer import Tokenizer

    if isinstance(tokenizer, Tokenizer):
        return tokenizer
    if tokenizer is None:
        raise UserError("exporting a torch module needs tokenizer= (a Tokenizer, a tokenizer.json, a directory "
                        "holding one, or a GGUF file)")
    path = Path(tokenizer).expanduser()
    if not path.exists():
        raise UserError(f"{path}: no such tokenizer file or directory")
    if path.is_file() and path.read_bytes()[:4] == b"GGUF":
        from edgeflash.runtime.sources.gguf import read_metadata

        return Tokenizer.from_gguf_metadata(read_metadata(path))
    try:
        return Tokenizer.from_tokenizer_json(path)
    except (ValueError, OSError) as e:
        raise UserError(f"{path}: not a usable tokenizer ({e})") from None


def load_torch_module(module: Any, config: Any, tokenizer: Any, name: str | None = None) -> ModelSource:
    import torch
    from edgeflash.runtime.families import family_for_hf_model_type
    from edgeflash.runtime.sources.hf import tensor_from_hf

    if config is None:
        config = getattr(module, "config", None)
    if config is None:
        raise UserError("exporting a torch module needs config= (its Hugging Face config as a dict or object)")
    cfg = config_dict(config)
    where = f"torch module {type(module).__name__}"
    family = family_for_hf_model_type(str(cfg.get("model_type")), where)
    spec = family.spec_from_hf(cfg, where)
    tensors: dict[str, Tensor] = {}
    with torch.no_grad():
        for hf_name, value in module.state_dict().items():
            canonical = family.hf_tensor_name(hf_name)
            if canonical is None:
                continue
            array = value.detach().to("cpu", torch.float32).contiguous().numpy()  # [rows, cols] or [n]
            shape = tuple(array.shape)
            rows = int(np.prod(shape[:-1])) if len(shape) > 1 else 1
            raw = array.reshape(rows, -1).view(np.uint8)
            tensors[canonical] = tensor_from_hf(family, canonical, "f32", shape, raw)
    if spec.tied_embeddings:
        tensors.pop("output.weight", None)
    source = ModelSource(path=Path(f"<{type(module).__name__}>"), kind="torch", spec=spec,
                         tokenizer=resolve_tokenizer(tokenizer), tensors=tensors,
                         info={"name": name or cfg.get("_name_or_path") or type(module).__name__})
    source.require(expected_tensor_names(spec))
    return source
