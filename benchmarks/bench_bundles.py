"""The q4_0 bundles the memory and speculative benchmarks share: exported once into
bench-out/bundles/ (full calibration), reused afterwards."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BUNDLES = REPO / "bench-out" / "bundles"


def ensure_bundle(model: str) -> Path:
    out = BUNDLES / f"{model}-q4_0"
    if not (out / "manifest.json").exists():
        print(f"exporting {model} to {out} (once)", file=sys.stderr)
        subprocess.run([sys.executable, "-m", "edgeflash.cli.main", "export", model, "-o", str(out), "--quant", "q4_0",
                        "--quiet"], check=True, cwd=REPO)
    return out
