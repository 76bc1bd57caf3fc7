"""Hugging Face model directories: config.json + *.safetensors (+ tokenizer.json).

Every file is opened only if it is a regular file, and read only up to a size limit (a
tokenizer.json that is a FIFO, a symlink to /dev/zero or a 40 GB file is refused, not read);
the config's fields are checked before the spec is built and the tensors' shapes after.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from edgeflash.base.errors import ModelFormatError, UnsupportedModelError
from edgeflash.base.printable import printable
from edgeflash.base.regular_files import read_json_limited, read_text_limited
from edgeflash.runtime.source import ModelSource, expected_tensor_names
from edgeflash.runtime.sources.safetensors_file import read_safetensors
from edgeflash.runtime.sources.validate import check_hf_config, check_tensor_shapes
from edgeflash.runtime.tensors import Tensor, dequantize_raw

# The largest sidecar files read (real ones: config.json a few KB, Gemma 3's tokenizer.json 33 MB
# and its tokenizer_config.json 1.2 MB, chat templates tens of KB).
SIDECAR_LIMITS = {"config.json": 16 << 20, "tokenizer.json": 256 << 20, "tokenizer_config.json": 64 << 20,
                  "chat_template.jinja": 4 << 20}


def read_json(path: Path) -> dict:
    data = read_json_limited(path, SIDECAR_LIMITS.get(path.name, 16 << 20), path.name)
    if not isinstance(data, dict):
        raise ModelFormatError(f"{printable(path)}: the top level is a JSON {type(data).__name__}; expected an object")
    return data


def load_hf_dir(path: str | Path) -> ModelSource:
    from edgeflash.runtime.families import family_for_hf_model_type

    path = Path(path)
    config = read_json(path / "config.json")
    where = printable(path / "config.json")
    family = family_for_hf_model_type(printable(config.get("model_type")), where)
    check_hf_config(config, where)
    spec = family.spec_from_hf(config, where)
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
    check_tensor_shapes(spec, {name: t.shape for name, t in tensors.items()}, printable(path))
    source = ModelSource(path=path, kind="hf", spec=spec, tokenizer=load_hf_tokenizer(path), tensors=tensors,
                         info={"name": printable(config.get("_name_or_path") or path.name)})
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
        raise ModelFormatError(f"{printable(path)}: no tokenizer.json (needed to tokenize text offline)")
    tok_data: Any = read_json(tok_file)
    config_file = path / "tokenizer_config.json"
    tok_config = read_json(config_file) if config_file.exists() or config_file.is_symlink() else {}
    template_file = path / "chat_template.jinja"  # transformers 5 saves the template on its own
    if (template_file.exists() or template_file.is_symlink()) and not tok_config.get("chat_template"):
        tok_config["chat_template"] = read_text_limited(template_file, SIDECAR_LIMITS[template_file.name],
                                                        template_file.name)
    try:
        return Tokenizer.from_tokenizer_json(tok_data, tokenizer_config=tok_config)
    except (ValueError, TypeError, KeyError) as e:  # a field of the wrong kind anywhere in the file
        raise UnsupportedModelError(f"{printable(tok_file)}: {printable(e, 400)}") from None
