"""What a model file holds, for `edgeflash inspect` on a GGUF file: the architecture, the
hyperparameters, the tokenizer and the tensors by format. The file is opened and checked as a
load would (every field, every tensor's place and shape); strings from it are shown escaped."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from edgeflash.base.printable import printable
from edgeflash.base.sizes import format_size
from edgeflash.runtime.sources.gguf import load_gguf


def gguf_summary(path: str | Path) -> dict[str, Any]:
    """The machine-readable summary `inspect --json` prints for a GGUF file."""
    source = load_gguf(path)
    gguf = source.info["gguf"]
    formats = Counter(t.fmt for t in source.tensors.values())
    return {
        "file": printable(source.path), "kind": "gguf", "gguf_version": gguf.version,
        "file_bytes": gguf.file_size, "model": printable(source.name), "spec": source.spec.to_dict(),
        "weights_bytes": source.weight_bytes, "tensors": len(source.tensors), "formats": dict(sorted(formats.items())),
        "alignment": gguf.alignment,
        "tokenizer": {"vocab_size": source.tokenizer.vocab_size, "chat_format": source.tokenizer.chat_format,
                      "source": printable(source.tokenizer.source)},
        "verified": "structure",  # GGUF files carry no checksums
    }


def render_gguf(summary: dict[str, Any]) -> str:
    spec = summary["spec"]
    formats = ", ".join(f"{n} {fmt}" for fmt, n in summary["formats"].items())
    tok = summary["tokenizer"]
    return "\n".join([
        (f"gguf      {summary['model']}  (GGUF v{summary['gguf_version']}, {format_size(summary['file_bytes'])}, "
         f"alignment {summary['alignment']})"),
        (f"model     {spec['family']}/{printable(spec['arch'])}: {spec['n_layers']} layers, d_model "
         f"{spec['d_model']}, d_ff {spec['d_ff']}, {spec['n_heads']}/{spec['n_kv_heads']} heads x {spec['head_dim']}, "
         f"vocab {spec['vocab_size']}, {'tied' if spec['tied_embeddings'] else 'untied'} head, "
         f"context {spec['context_length']}"),
        f"weights   {format_size(summary['weights_bytes'])} in {summary['tensors']} tensors: {formats}",
        f"tokenizer {tok['source']}, {tok['vocab_size']} tokens, chat format {tok['chat_format']}",
        "checks    every field, tensor offset and shape (GGUF files carry no checksums)",
    ])
