"""Export directories for the mobile app tests: manifest.json and tokenizer.json as the exporter
writes them, from a real model's spec and tokenizer, without lowering the chunk files."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace


def write_export(out: Path, source, target: str, kv: str, chunks: int, cache_len: int, prefill: int) -> Path:
    """An export directory's manifest and tokenizer, written by the exporter's own manifest code
    (the chunk files themselves are not needed by the logic under test)."""
    import importlib

    from edgeflash.export import targets
    from edgeflash.export.quant import resolve_config
    from edgeflash.export.targets.chunks import TOKENIZER_FILE, chunk_io, plan_chunks, write_manifest

    spec = source.spec
    module = importlib.import_module(f"edgeflash.export.targets.{target}")
    layer_bytes = int((4 * spec.d_model * spec.n_heads * spec.head_dim + 3 * spec.d_model * spec.d_ff) * 0.5625)
    embed_bytes = int(spec.vocab_size * spec.d_model * 0.5625)
    entries = []
    for chunk in plan_chunks(spec.n_layers, chunks):
        inputs, outputs = chunk_io(spec, chunk, kv, cache_len)
        size = len(chunk.layers) * layer_bytes + embed_bytes * (int(chunk.first) + int(chunk.last))
        entries.append({"file": f"chunk{chunk.index}{module.EXTENSION}", "layers": [chunk.layers.start, chunk.layers.stop],
                        "embedding": chunk.first, "head": chunk.last, "inputs": inputs, "outputs": outputs, "bytes": size})
    prepared = SimpleNamespace(source=source, config=resolve_config("q4_0", None),
                               bytes_by_kind=lambda: {"int4": sum(e["bytes"] for e in entries)})
    manifest = targets._manifest(prepared, target, kv, cache_len, prefill, entries, {}, module)
    out.mkdir(parents=True)
    write_manifest(out, manifest)
    (out / TOKENIZER_FILE).write_text(source.tokenizer.to_json(), encoding="utf-8")
    return out
