"""A model as loaded from any source: its spec, tokenizer and raw tensors by canonical name."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgeflash.errors import ModelFormatError
from edgeflash.runtime.spec import ModelSpec
from edgeflash.runtime.tensors import Tensor


@dataclass
class ModelSource:
    path: Path
    kind: str  # "gguf" | "hf" | "bundle" | "torch"
    spec: ModelSpec
    tokenizer: Any  # edgeflash.runtime.tokenizer.Tokenizer
    tensors: dict[str, Tensor]
    info: dict[str, Any] = field(default_factory=dict)  # name, sizes, bundle manifest...

    @property
    def name(self) -> str:
        return str(self.info.get("name") or self.path.name)

    @property
    def weight_bytes(self) -> int:
        return sum(t.nbytes for t in self.tensors.values())

    def require(self, names: list[str]) -> None:
        missing = [n for n in names if n not in self.tensors]
        if missing:
            raise ModelFormatError(f"{self.path}: tensors missing: {', '.join(missing[:5])}"
                                   + (f" and {len(missing) - 5} more" if len(missing) > 5 else ""))


def expected_tensor_names(spec: ModelSpec) -> list[str]:
    """Every tensor a model of this spec must have (optional ones like biases excluded)."""
    names = ["token_embd.weight", "output_norm.weight"]
    if not spec.tied_embeddings:
        names.append("output.weight")
    per_layer = ["attn_norm.weight", "attn_q.weight", "attn_k.weight", "attn_v.weight", "attn_output.weight",
                 "ffn_norm.weight", "ffn_gate.weight", "ffn_up.weight", "ffn_down.weight"]
    if spec.qk_norm:
        per_layer += ["attn_q_norm.weight", "attn_k_norm.weight"]
    if spec.sandwich_norm:
        per_layer += ["post_attention_norm.weight", "post_ffw_norm.weight"]
    if spec.attn_bias:
        per_layer += ["attn_q.bias", "attn_k.bias", "attn_v.bias"]
    return names + [f"blk.{i}.{n}" for i in range(spec.n_layers) for n in per_layer]


def open_model(path: str | Path, *, verify: bool = True) -> ModelSource:
    """Load a GGUF file, a Hugging Face directory or an edgeflash bundle, by what is on disk.
    `verify=False` skips a bundle's checksum pass (a budgeted run verifies with direct I/O)."""
    path = Path(path).expanduser()
    if not path.exists():
        raise ModelFormatError(f"{path}: no such file or directory")
    if path.is_dir():
        if (path / "manifest.json").exists():
            from edgeflash.runtime.bundle import load_bundle

            return load_bundle(path, verify=verify)
        if (path / "config.json").exists():
            from edgeflash.export.sources.hf import load_hf_dir

            return load_hf_dir(path)
        raise ModelFormatError(f"{path}: directory has neither manifest.json (an edgeflash bundle) nor "
                               "config.json (a Hugging Face model)")
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic == b"GGUF":
        from edgeflash.export.sources.gguf import load_gguf

        return load_gguf(path)
    raise ModelFormatError(f"{path}: not a model file (starts with {magic!r}; expected a GGUF file, "
                           "an edgeflash bundle directory or a Hugging Face directory)")
