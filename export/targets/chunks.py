"""Partition into chunks of consecutive layers, and the manifest that says how to chain them.

Chunk 0 also holds the token embedding and the last chunk the final norm and the head, so a
runner loads chunk files in order, passing the hidden state [T, d_model] from one to the next.
The manifest (`manifest.json`) lists, per chunk, its file, layers, methods and the name, dtype
and shape of every input and output ("T" = the method's token count), plus the cache layout.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgeflash.base.errors import UserError
from edgeflash.runtime.spec import ModelSpec

MANIFEST_FILE = "manifest.json"
TOKENIZER_FILE = "tokenizer.json"
MANIFEST_FORMAT = "edgeflash-target"
MANIFEST_VERSION = 1


@dataclass(frozen=True)
class Chunk:
    index: int
    layers: range
    first: bool  # holds the embedding
    last: bool  # holds the final norm and the head


def plan_chunks(n_layers: int, chunks: int) -> list[Chunk]:
    """`chunks` runs of consecutive layers, sizes differing by at most one (earlier ones larger)."""
    if isinstance(chunks, bool) or not isinstance(chunks, int) or chunks < 1:
        raise UserError(f"chunks = {chunks!r}: expected an integer >= 1")
    if chunks > n_layers:
        raise UserError(f"chunks = {chunks}: the model has only {n_layers} layers (at most one chunk per layer)")
    base, extra = divmod(n_layers, chunks)
    out, start = [], 0
    for i in range(chunks):
        size = base + (1 if i < extra else 0)
        out.append(Chunk(i, range(start, start + size), first=i == 0, last=i == chunks - 1))
        start += size
    return out


def chunk_io(spec: ModelSpec, chunk: Chunk, kv: str, cache_len: int) -> tuple[list[dict], list[dict]]:
    """Inputs and outputs of a chunk's methods, in call order."""
    inputs = [{"name": "tokens", "dtype": "int64", "shape": ["T"]} if chunk.first else
              {"name": "hidden", "dtype": "float32", "shape": ["T", spec.d_model]},
              {"name": "input_pos", "dtype": "int64", "shape": ["T"]}]
    if chunk.last:
        inputs.append({"name": "last", "dtype": "int64", "shape": [1]})
    outputs = [{"name": "logits", "dtype": "float32", "shape": [1, spec.vocab_size]} if chunk.last else
               {"name": "hidden", "dtype": "float32", "shape": ["T", spec.d_model]}]
    if kv == "io":
        for layer in chunk.layers:
            for kind in ("k", "v"):
                inputs.append({"name": f"{kind}_cache.{layer}", "dtype": "float32",
                               "shape": [spec.n_kv_heads, cache_len, spec.head_dim]})
                outputs.append({"name": f"{kind}_new.{layer}", "dtype": "float32",
                                "shape": [spec.n_kv_heads, "T", spec.head_dim]})
    return inputs, outputs


def cache_layout(spec: ModelSpec, kv: str, cache_len: int) -> dict[str, Any]:
    return {
        "mode": kv,
        "length": cache_len,
        "dtype": "float32",
        "shape": [spec.n_kv_heads, cache_len, spec.head_dim],
        "slot": "position",  # the entry of position p lives at index p of the length axis
        "windows": [spec.window(i) for i in range(spec.n_layers)],
        "note": ("state: the cache lives in the chunk program and both methods update it in place"
                 if kv == "state" else
                 "io: pass each layer's cache in (earlier positions filled), write the returned new "
                 "entries at input_pos yourself"),
    }


def write_manifest(out: Path, manifest: dict[str, Any]) -> None:
    (out / MANIFEST_FILE).write_text(json.dumps(manifest, indent=1), encoding="utf-8")


def read_manifest(path: Path) -> dict[str, Any]:
    f = Path(path) / MANIFEST_FILE
    try:
        manifest = json.loads(f.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UserError(f"{path}: no {MANIFEST_FILE} (not an edgeflash target export)") from None
    except ValueError as e:
        raise UserError(f"{f}: not valid JSON ({e})") from None
    if manifest.get("format") != MANIFEST_FORMAT:
        raise UserError(f"{f}: format is {manifest.get('format')!r}, expected {MANIFEST_FORMAT!r}")
    if int(manifest.get("version", 0)) > MANIFEST_VERSION:
        raise UserError(f"{f}: version {manifest.get('version')} is newer than this edgeflash reads "
                        f"({MANIFEST_VERSION})")
    return manifest
