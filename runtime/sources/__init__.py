"""Open a model by what is on disk: a GGUF file, a Hugging Face directory or an edgeflash bundle.
The readers here are all a device needs; the exporter uses them too."""

from __future__ import annotations

import os
from pathlib import Path

from edgeflash.base.errors import ModelFormatError
from edgeflash.base.printable import printable
from edgeflash.base.regular_files import open_regular
from edgeflash.runtime.source import ModelSource


def open_model(path: str | Path, *, verify: bool = True, tokenizer_of: ModelSource | None = None) -> ModelSource:
    """Load a GGUF file, a Hugging Face directory or an edgeflash bundle, by what is on disk.
    `verify=False` skips a bundle's checksum pass (a budgeted run verifies with direct I/O).
    `tokenizer_of`: an opened GGUF model whose tokenizer a GGUF file at `path` uses instead of
    building its own when its tokenizer metadata is the same (a draft model beside its target)."""
    path = Path(path).expanduser()
    shown = printable(path)
    if not path.exists():
        raise ModelFormatError(f"{shown}: no such file or directory")
    if path.is_dir():
        if (path / "manifest.json").exists():
            from edgeflash.runtime.bundle import load_bundle

            return load_bundle(path, verify=verify)
        if (path / "config.json").exists():
            from edgeflash.runtime.sources.hf import load_hf_dir

            return load_hf_dir(path)
        raise ModelFormatError(f"{shown}: directory has neither manifest.json (an edgeflash bundle) nor "
                               "config.json (a Hugging Face model)")
    fd = open_regular(path, "model file")  # a FIFO or a device is refused before it is read
    try:
        magic = os.pread(fd, 4, 0)
    finally:
        os.close(fd)
    if magic == b"GGUF":
        from edgeflash.runtime.sources.gguf import load_gguf

        return load_gguf(path, tokenizer_of=tokenizer_of)
    raise ModelFormatError(f"{shown}: not a model file (starts with {printable(repr(magic))}; expected a GGUF file, "
                           "an edgeflash bundle directory or a Hugging Face directory)")
