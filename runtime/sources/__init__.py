"""Open a model by what is on disk: a GGUF file, a Hugging Face directory or an edgeflash bundle.
The readers here are all a device needs; the exporter uses them too."""

from __future__ import annotations

from pathlib import Path

from edgeflash.base.errors import ModelFormatError
from edgeflash.runtime.source import ModelSource


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
            from edgeflash.runtime.sources.hf import load_hf_dir

            return load_hf_dir(path)
        raise ModelFormatError(f"{path}: directory has neither manifest.json (an edgeflash bundle) nor "
                               "config.json (a Hugging Face model)")
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic == b"GGUF":
        from edgeflash.runtime.sources.gguf import load_gguf

        return load_gguf(path)
    raise ModelFormatError(f"{path}: not a model file (starts with {magic!r}; expected a GGUF file, "
                           "an edgeflash bundle directory or a Hugging Face directory)")
