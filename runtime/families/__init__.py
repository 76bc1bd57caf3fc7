"""Model families, looked up in one explicit map. Each family module has the same contract:

- `GGUF_ARCHS`, `HF_MODEL_TYPES`: the source architecture names it runs;
- `spec_from_gguf(meta, tensor_names)`, `spec_from_hf(config)` -> ModelSpec;
- `hf_tensor_name(name)` -> canonical (GGUF-style) tensor name or None to drop it;
- `fix_hf_tensor(name, array)`, `fix_gguf_tensor(tensor, spec, arch)`: layout fixes to the
  canonical layout (rotate-half RoPE rows, norms stored as the multiplier);
- `embed(ops, spec, w, tokens)`, `block(ops, spec, layer, w, x, ctx)`, `final_norm(ops, spec, w, x)`:
  the numpy reference forward pass.
"""

from __future__ import annotations

from types import ModuleType

from edgeflash.base.errors import UnsupportedModelError
from edgeflash.runtime.families import gemma3, llama

FAMILIES: dict[str, ModuleType] = {"llama": llama, "gemma3": gemma3}


def family_for_gguf_arch(arch: str, where: str) -> ModuleType:
    for module in FAMILIES.values():
        if arch in module.GGUF_ARCHS:
            return module
    known = sorted(a for m in FAMILIES.values() for a in m.GGUF_ARCHS)
    raise UnsupportedModelError(f"{where}: architecture {arch!r} is not supported (supported: {', '.join(known)})")


def family_for_hf_model_type(model_type: str, where: str) -> ModuleType:
    for module in FAMILIES.values():
        if model_type in module.HF_MODEL_TYPES:
            return module
    known = sorted(a for m in FAMILIES.values() for a in m.HF_MODEL_TYPES)
    raise UnsupportedModelError(f"{where}: model_type {model_type!r} is not supported (supported: {', '.join(known)})")


def family(name: str) -> ModuleType:
    try:
        return FAMILIES[name]
    except KeyError:
        raise UnsupportedModelError(f"model family {name!r} is not supported ({', '.join(FAMILIES)})") from None
