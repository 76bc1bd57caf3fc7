"""Where does ExecuTorch's export lose quality? Teacher-forced perplexity after each stage.

  python benchmarks/peers/check_executorch_stages.py --model gemma3-270m --windows 2

Stages, each on the same held-out token ids, fed one position at a time through the KV cache
exactly as the exported `forward` is driven:
  transformers   fp32 reference
  et_fp32        ExecuTorch's eager model after its source transforms (custom SDPA + KV cache,
                 ring buffer on sliding layers), no quantization
  et_8da4w       the same with quantization.qmode=8da4w group 32, still eager (torchao tensors)
The lowered .pte itself is measured by run_executorch.py --perplexity.
Prints one JSON object: perplexity and top-1 agreement with transformers per stage.
"""

from __future__ import annotations

import argparse
import json
import math
import sys

import torch

from export_executorch import export_command
from hf_models import load_hf
from models import get_model
from workloads import perplexity_windows


def llm_config_from_command(model, qmode: str | None):
    """LlmConfig built from the same overrides export_executorch.py passes to export_llm."""
    from executorch.extension.llm.export.config.llm_config import LlmConfig
    from omegaconf import OmegaConf

    overrides = [a for a in export_command(model) if "=" in a and not a.startswith("base.metadata")]
    overrides = [a for a in overrides if not a.startswith("quantization.")]
    if qmode:
        overrides += [f"quantization.qmode={qmode}", "quantization.group_size=32"]
    merged = OmegaConf.merge(OmegaConf.structured(LlmConfig), OmegaConf.from_dotlist(overrides))
    return OmegaConf.to_object(merged)


def build_eager(model, qmode: str | None) -> torch.nn.Module:
    import executorch_gemma3
    from executorch.examples.models.llama import export_llama_lib as lib

    executorch_gemma3.install_export_hook()
    manager = lib._prepare_for_llama_export(llm_config_from_command(model, qmode))
    return manager.model.eval()


def score(step, windows: list[list[int]]) -> tuple[float, int, list[torch.Tensor]]:
    """Sum of NLL, count, and per-window argmax ids; `step(token, pos)` -> logits [vocab]."""
    nll, n, argmaxes = 0.0, 0, []
    for ids in windows:
        preds = []
        for pos in range(len(ids) - 1):
            logits = step(ids[pos], pos).float()
            nll += float(torch.logsumexp(logits, 0) - logits[ids[pos + 1]])
            preds.append(int(logits.argmax()))
            n += 1
        argmaxes.append(torch.tensor(preds))
    return nll, n, argmaxes


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True)
    p.add_argument("--windows", type=int, default=2)
    p.add_argument("--stages", nargs="+", default=["et_fp32", "et_8da4w"])
    args = p.parse_args()
    model = get_model(args.model)
    torch.set_num_threads(2)
    windows = perplexity_windows(model)[: args.windows]

    hf, _ = load_hf(model)
    with torch.inference_mode():
        ref_nll, ref_n, ref_argmax = 0.0, 0, []
        for ids in windows:
            x = torch.tensor([ids])
            logits = hf(input_ids=x).logits[0, :-1]  # [T-1, vocab]
            ref_nll += float(torch.nn.functional.cross_entropy(logits, x[0, 1:], reduction="sum"))
            ref_n += len(ids) - 1
            ref_argmax.append(logits.argmax(-1))
    del hf
    report = {"model": model.name, "windows": len(windows), "tokens": ref_n,
              "stages": {"transformers": {"perplexity": round(math.exp(ref_nll / ref_n), 4)}}}
    print(f"transformers: {report['stages']['transformers']}", file=sys.stderr)

    for stage in args.stages:
        et = build_eager(model, "8da4w" if stage == "et_8da4w" else None)

        def step(token: int, pos: int) -> torch.Tensor:
            out = et(torch.tensor([[token]]), {"input_pos": torch.tensor([pos])})
            return (out[0] if isinstance(out, tuple) else out).reshape(-1)

        with torch.inference_mode():
            nll, n, argmax = score(step, windows)
        agree = float(sum((a == b).sum() for a, b in zip(argmax, ref_argmax)) / n)
        report["stages"][stage] = {"perplexity": round(math.exp(nll / n), 4), "top1_agreement": round(agree, 4)}
        print(f"{stage}: {report['stages'][stage]}", file=sys.stderr)
        del et
    print(json.dumps(report))


if __name__ == "__main__":
    main()
