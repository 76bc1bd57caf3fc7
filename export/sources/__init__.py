"""Model sources for export: GGUF files, Hugging Face directories, torch modules."""

from edgeflash.export.sources.resolve import load_source

__all__ = ["load_source"]
