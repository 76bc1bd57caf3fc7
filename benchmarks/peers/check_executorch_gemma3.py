"""Does ExecuTorch's eager llama Transformer compute Gemma 3? Layer by layer against transformers.

  python benchmarks/peers/check_executorch_gemma3.py [--tokens 300]

Runs the converted checkpoint (export_executorch.py --convert-only) through ExecuTorch's eager
model, before any quantization or lowering, on held-out text, and compares every layer's output
and the final logits with transformers (fp32) on the same token ids. It does this for the full
fix (executorch_gemma3.apply_gemma3) and for ablations that each drop one Gemma 3 feature, i.e.
what the stock llama Transformer computes for that part. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import sys

import torch
from torch import nn

import executorch_gemma3 as g3
from hf_models import load_hf
from models import get_model
from workloads import perplexity_windows

ABLATIONS = ["full_fix", "silu_mlp", "no_post_norms", "one_rope_base", "no_embedding_scale", "norm_scale_w"]


def build_executorch_eager(model_dir, n_tokens: int) -> nn.Module:
    from executorch.examples.models.llama.model import Llama2Model
    from executorch.extension.llm.export.config.llm_config import LlmConfig

    cfg = LlmConfig()
    cfg.base.checkpoint = str(model_dir / "checkpoint.pth")
    cfg.base.params = str(model_dir / "params.json")
    cfg.model.use_kv_cache = False  # plain causal attention: fine while n_tokens <= sliding window
    cfg.model.enable_dynamic_shape = False
    cfg.export.max_seq_length = n_tokens
    cfg.export.max_context_length = n_tokens
    cfg.debug.generate_full_logits = True
    m = Llama2Model(cfg).get_eager_model()
    section = g3.read_gemma3_section(cfg.base.params)
    g3.apply_gemma3(m, cfg.base.checkpoint, section)
    return m.eval()


def ablate(m: nn.Module, which: str, embed_scale: float) -> None:
    import torch.nn.functional as F

    from executorch.examples.models.llama.norm import RMSNorm

    if which == "silu_mlp":
        for layer in m.layers:
            ff = layer.feed_forward
            ff.forward = lambda x, ff=ff: ff.w2(F.silu(ff.w1(x)) * ff.w3(x))
    elif which == "no_post_norms":
        for layer in m.layers:
            layer.post_attention_norm = nn.Identity()
            layer.post_ffn_norm = nn.Identity()
    elif which == "one_rope_base":
        for layer in m.layers:
            layer.local_rope = None
    elif which == "no_embedding_scale":
        m.tok_embeddings.weight.data /= embed_scale
    elif which == "norm_scale_w":
        for mod in m.modules():
            if isinstance(mod, RMSNorm):
                mod.add_unit_offset = False


def capture_layers(layers) -> tuple[list[torch.Tensor], list]:
    outs: list[torch.Tensor] = []

    def hook(_mod, _inp, out):
        outs.append((out[0] if isinstance(out, tuple) else out).detach())

    return outs, [layer.register_forward_hook(hook) for layer in layers]


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tokens", type=int, default=300)
    args = p.parse_args()
    model = get_model("gemma3-270m")
    torch.set_num_threads(2)
    ids = torch.tensor([perplexity_windows(model)[0][: args.tokens]])  # [1, T], BOS first

    hf, _ = load_hf(model)
    hf_layers, hooks = capture_layers(hf.model.layers)
    with torch.inference_mode():
        hf_logits = hf(input_ids=ids).logits[0]  # [T, vocab]
    for h in hooks:
        h.remove()

    report = {"tokens": ids.shape[1], "variants": {}}
    for which in ABLATIONS:
        et = build_executorch_eager(model.executorch_dir, ids.shape[1])
        ablate(et, which, hf.config.hidden_size ** 0.5)
        et_layers, hooks = capture_layers(et.layers)
        with torch.inference_mode():
            et_logits = et(ids)[0]  # [T, vocab]
        agree = float((et_logits.argmax(-1) == hf_logits.argmax(-1)).float().mean())
        report["variants"][which] = {
            "layer_rel_err": [round(rel_err(a, b), 6) for a, b in zip(et_layers, hf_layers)],
            "logits_rel_err": round(rel_err(et_logits, hf_logits), 6),
            "logits_max_abs_diff": round(float((et_logits - hf_logits).abs().max()), 5),
            "top1_agreement": round(agree, 4),
        }
        print(f"{which}: logits rel err {report['variants'][which]['logits_rel_err']:.2e}, "
              f"top-1 agreement {agree:.3f}", file=sys.stderr)
        del et
    print(json.dumps(report))


if __name__ == "__main__":
    main()
