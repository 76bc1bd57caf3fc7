"""Hugging Face model directories: config.json + *.safetensors (+ tokenizer.json)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from edgeflash.base.errors import ModelFormatError, UnsupportedModelError
from edgeflash.runtime.source import ModelSource, expected_tensor_names
from edgeflash.runtime.sources.safetensors_file import read_safetensors
from edgeflash.runtime.tensors import Tensor, dequantize_raw


def read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ModelFormatError(f"{path}: no such file") from None
    except ValueError as e:
        raise ModelFormatError(f"{path}: not valid JSON ({e})") from None


def load_hf_dir(path: str | Path) -> ModelSource:
    from edgeflash.runtime.families import family_for_hf_model_type

    path = Path(path)
    config = read_json(path / "config.json")
    family = family_for_hf_model_type(str(config.get("model_type")), str(path / "config.json"))
    spec = family.spec_from_hf(config, str(path / "config.json"))
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ModelFormatError(f"{path}: no *.safetensors files (pytorch .bin checkpoints are not supported)")
    tensors: dict[str, Tensor] = {}
    for file in files:
        for hf_name, (fmt, shape, raw) in read_safetensors(file).items():
            name = family.hf_tensor_name(hf_name)
            if name is not None:
                tensors[name] = tensor_from_hf(family, name, fmt, shape, raw)
    if spec.tied_embeddings:
        tensors.pop("output.weight", None)
    source = ModelSource(path=path, kind="hf", spec=spec, tokenizer=load_hf_tokenizer(path), tensors=tensors,
                         info={"name": config.get("_name_or_path") or path.name})
    source.require(expected_tensor_names(spec))
    return source


def tensor_from_hf(family, name: str, fmt: str, shape: tuple[int, ...], raw: np.ndarray) -> Tensor:
    """Raw HF bytes as a canonical tensor; tensors a family must adjust are converted to f32."""
    cols = shape[-1]
    rows = int(np.prod(shape[:-1])) if len(shape) > 1 else 1
    tensor = Tensor(name, fmt, shape, raw.reshape(rows, -1))
    values = dequantize_raw(tensor.raw, fmt, cols).reshape(shape) if name.endswith("norm.weight") else None
    if values is not None:
        fixed = family.fix_hf_tensor(name, values)
        return Tensor.from_array(name, fixed, "f32")
    return tensor


def load_hf_tokenizer(path: Path):
    from edgeflash.runtime.tokenizer import Tokenizer

    tok_file = path / "tokenizer.json"
    if not tok_file.exists():
        raise ModelFormatError(f"{path}: no tokenizer.json (needed to tokenize text offline)")
    config_file = path / "tokenizer_config.json"
    tok_config = read_json(config_file) if config_file.exists() else {}
    template_file = path / "chat_template.jinja"  # transformers 5 saves the template on its own
    if template_file.exists() and not tok_config.get("chat_template"):
        tok_config["chat_template"] = template_file.read_text(encoding="utf-8")
    try:
        return Tokenizer.from_tokenizer_json(tok_file, tokenizer_config=tok_config)
    except ValueError as e:
        raise UnsupportedModelError(f"{tok_file}: {e}") from None
