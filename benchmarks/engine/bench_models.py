"""The four models the engine benchmarks run, as GGUF files and as bundles (q4_0 unless told).

A name is a model alias (`gemma3-270m`, `smollm2-135m`, `qwen2.5-coder-0.5b`, `qwen2.5-coder-1.5b`)
or a path. The q4_0 bundle of a model is `bench-out/bundles/<name>-q4_0`, written by
`edgeflash export <model> -o <dir> --quant q4_0` when asked for (an export of the 1.5B model is a
heavy job: minutes on two cores).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BENCH_OUT = REPO / "bench-out"
MODELS = ("gemma3-270m", "smollm2-135m", "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b")
# Where the Qwen2.5-Coder aliases assemble their GGUF files (used while an alias is not known here).
_CACHE = Path.home() / ".cache" / "edgeflash" / "models"
_CACHED_FILES = {
    "qwen2.5-coder-0.5b": "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
    "qwen2.5-coder-1.5b": "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
}


def gguf_path(name: str) -> Path:
    """The GGUF file of a model alias (or the path given)."""
    from edgeflash.base.models import ALIASES, resolve_model

    if name in ALIASES:
        return resolve_model(name)
    if name in _CACHED_FILES and (_CACHE / _CACHED_FILES[name]).is_file():
        return _CACHE / _CACHED_FILES[name]
    path = Path(name).expanduser()
    if not path.exists():
        raise SystemExit(f"model {name!r}: not a known alias ({', '.join(MODELS)}) and no such file")
    return path


def bundle_dir(name: str, quant: str = "q4_0") -> Path:
    scheme = re.sub(r"[^A-Za-z0-9._-]+", "_", quant)  # `mixed:ffn=q8_0,...` as a directory name
    return BENCH_OUT / "bundles" / f"{Path(name).stem if '/' in name else name}-{scheme}"


# A bundle spec "SCHEME+dense" is the scheme's bundle without a neuron arena: every FFN matrix in
# the row layout, for dense runs only (no sparse mode), the layout the GGUF path reads.
DENSE_SUFFIX = "+dense"


def ensure_bundle(name: str, quant: str = "q4_0", export: bool = False) -> Path | None:
    """The model's bundle directory; exported first when `export` (else None if absent)."""
    out = bundle_dir(name, quant)
    if (out / "manifest.json").is_file():
        return out
    if not export:
        return None
    out.parent.mkdir(parents=True, exist_ok=True)
    cmd = [
        str(Path(sys.executable).parent / "edgeflash"),
        "export",
        str(gguf_path(name)),
        "-o",
        str(out),
        "--quant",
        quant.removesuffix(DENSE_SUFFIX),
        "--no-baseline",
        "--quiet",
        "-f",
    ]
    if quant.endswith(DENSE_SUFFIX):
        cmd.append("--no-neuron-arena")
    print("$ " + " ".join(cmd), file=sys.stderr, flush=True)
    subprocess.run(cmd, check=True)
    return out
