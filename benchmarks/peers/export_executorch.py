"""ExecuTorch's own LLM export (export_llm -> XNNPACK .pte, 8da4w) for the benchmark models.

  python benchmarks/peers/export_executorch.py --model smollm2-135m            # convert + export
  python benchmarks/peers/export_executorch.py --model gemma3-270m --convert-only
  python benchmarks/peers/export_executorch.py --model gemma3-270m --print-command
  python benchmarks/peers/export_executorch.py --model qwen2.5-coder-0.5b      # ExecuTorch's qwen2_5 recipe

Steps: transformers loads the GGUF (fp32) -> tokenizer.json is saved -> the state dict is renamed
to ExecuTorch's llama names and saved with torch.save -> params.json -> export_llm. SmolLM2 runs
ExecuTorch's stock CLI. Gemma 3 runs the same CLI through executorch_gemma3.py, which adds the
layer pieces the stock llama Transformer lacks (see that file); its checkpoint additionally
carries the post-norm weights and an untied embedding with Gemma's sqrt(dim) scale folded in.
Qwen2.5-Coder follows ExecuTorch's own examples/models/qwen2_5 recipe: its convert_weights renames
transformers' fp32 safetensors copy (bench-out/hf/<model>/), and export_llm runs with its
qwen2_5_coder_xnnpack_q8da4w.yaml (8da4w, group size 128, 8-bit embedding, 2048-token context).

Everything lands in bench-out/executorch/<model>/. One export takes 10-20 minutes on a quiet
2-core machine and over an hour on a busy one: run it in the background.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from pathlib import Path

from hf_models import adds_bos, eos_ids, load_hf
from models import BenchModel, get_model

# One context for both models: a 500-token prompt plus 128 generated tokens must fit.
MAX_SEQ_LENGTH = 512  # longest prefill chunk the method accepts
MAX_CONTEXT_LENGTH = 1024
GROUP_SIZE = 32

# transformers name (layer part after "model.layers.{i}.") -> ExecuTorch llama name
LAYER_NAMES = {
    "self_attn.q_proj": "attention.wq",
    "self_attn.k_proj": "attention.wk",
    "self_attn.v_proj": "attention.wv",
    "self_attn.o_proj": "attention.wo",
    "self_attn.q_norm": "attention.q_norm_fn",
    "self_attn.k_norm": "attention.k_norm_fn",
    "input_layernorm": "attention_norm",
    "mlp.gate_proj": "feed_forward.w1",
    "mlp.down_proj": "feed_forward.w2",
    "mlp.up_proj": "feed_forward.w3",
}
# Llama-style models have one norm before the MLP; Gemma 3 has four norms per layer.
LLAMA_LAYER_NAMES = {**LAYER_NAMES, "post_attention_layernorm": "ffn_norm"}
GEMMA3_LAYER_NAMES = {
    **LAYER_NAMES,
    "pre_feedforward_layernorm": "ffn_norm",
    "post_attention_layernorm": "post_attention_norm",
    "post_feedforward_layernorm": "post_ffn_norm",
}


def rename_state_dict(state: dict, layer_names: dict[str, str]) -> dict:
    out = {}
    for key, value in state.items():
        if key == "lm_head.weight":
            continue  # tied: output.weight is set from the embedding below
        if key == "model.embed_tokens.weight":
            out["tok_embeddings.weight"] = value
        elif key == "model.norm.weight":
            out["norm.weight"] = value
        elif key.startswith("model.layers."):
            _, _, idx, rest = key.split(".", 3)
            part, leaf = rest.rsplit(".", 1)
            if part not in layer_names:
                raise KeyError(f"{key}: no ExecuTorch name for layer part {part!r}")
            out[f"layers.{idx}.{layer_names[part]}.{leaf}"] = value
        else:
            raise KeyError(f"{key}: unexpected tensor in the transformers state dict")
    out["output.weight"] = out["tok_embeddings.weight"]
    return out


def llama_params(cfg, qkv_bias: bool) -> dict:
    """ExecuTorch's params.json for a llama-shaped model (its qwen2_5 params files have these fields
    too), read from the model's transformers config; Qwen2.5 has q/k/v biases, SmolLM2 none."""
    return {"dim": cfg.hidden_size, "hidden_dim": cfg.intermediate_size, "ffn_dim_multiplier": 1,
            "n_heads": cfg.num_attention_heads, "n_kv_heads": cfg.num_key_value_heads,
            "n_layers": cfg.num_hidden_layers, "norm_eps": cfg.rms_norm_eps,
            "rope_theta": float(cfg.rope_parameters["rope_theta"]), "use_scaled_rope": False,
            "vocab_size": cfg.vocab_size, "use_hf_rope": True, "attention_qkv_bias": qkv_bias}


def import_qwen2_5_convert_weights():
    """ExecuTorch's examples/models/qwen2_5/convert_weights module.

    It imports `get_mapped_key` from torchtune.models.convert_weights, but torchtune 0.6.1 (the last
    release) cannot be imported as a package next to torchao 0.18: its __init__ pulls in every
    submodule, and one of them imports torchao.dtypes.nf4tensor, which torchao 0.18 no longer has.
    The one module convert_weights needs imports only torch, so it is loaded by itself from
    bench-out/torchtune-0.6.1 (setup-env.sh installs it there, outside the venv).
    """
    import importlib
    import importlib.util
    import types

    from models import BENCH_OUT

    file = BENCH_OUT / "torchtune-0.6.1" / "torchtune" / "models" / "convert_weights.py"
    if not file.exists():
        raise SystemExit(f"{file}: missing, run `pip install --no-deps --target {file.parents[2]} "
                         "torchtune==0.6.1` (or bash benchmarks/peers/setup-env.sh)")
    for name in ("torchtune", "torchtune.models"):
        sys.modules.setdefault(name, types.ModuleType(name))
    spec = importlib.util.spec_from_file_location("torchtune.models.convert_weights", file)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.modules["torchtune.models.convert_weights"] = module
    # The module itself: its package re-exports the function under the module's name.
    return importlib.import_module("executorch.examples.models.qwen2_5.convert_weights")


def convert_qwen2_5(model: BenchModel) -> None:
    """ExecuTorch's qwen2_5 convert_weights on transformers' fp32 copy of the GGUF."""
    from hf_models import hf_dir

    out = model.executorch_dir
    out.mkdir(parents=True, exist_ok=True)
    hf, tok = load_hf(model)  # writes bench-out/hf/<model>/model.safetensors on first use
    tok.save_pretrained(out)
    params = llama_params(hf.config, qkv_bias=True)
    del hf
    import_qwen2_5_convert_weights().convert_weights(str(hf_dir(model)), str(out / "checkpoint.pth"))
    (out / "params.json").write_text(json.dumps(params, indent=1))
    (out / "prompt_format.json").write_text(json.dumps({"adds_bos": adds_bos(tok)}))
    print(f"converted {model.name} -> {out}", file=sys.stderr)


def gemma3_params(cfg) -> tuple[dict, dict]:
    params = {"dim": cfg.hidden_size, "hidden_dim": cfg.intermediate_size, "head_dim": cfg.head_dim,
              "n_heads": cfg.num_attention_heads, "n_kv_heads": cfg.num_key_value_heads,
              "n_layers": cfg.num_hidden_layers, "norm_eps": cfg.rms_norm_eps,
              "rope_theta": float(cfg.rope_parameters["full_attention"]["rope_theta"]),
              "use_scaled_rope": False, "vocab_size": cfg.vocab_size, "use_hf_rope": True,
              "attention_qkv_bias": False, "use_qk_norm": True, "qk_norm_before_rope": True,
              "rms_norm_add_unit_offset": True}
    if cfg.query_pre_attn_scalar != cfg.head_dim:
        raise ValueError(f"query_pre_attn_scalar {cfg.query_pre_attn_scalar} != head_dim {cfg.head_dim}: "
                         "ExecuTorch's SDPA scales by 1/sqrt(head_dim) only")
    if cfg.final_logit_softcapping or cfg.attn_logit_softcapping:
        raise ValueError("logit soft-capping is not expressible in ExecuTorch's llama Transformer")
    sliding = [i for i, t in enumerate(cfg.layer_types) if t == "sliding_attention"]
    extra = {"local_rope_theta": float(cfg.rope_parameters["sliding_attention"]["rope_theta"]),
             "sliding_layers": sliding, "sliding_window": cfg.sliding_window,
             "pattern": [cfg.sliding_window if t == "sliding_attention" else 0
                         for t in cfg.layer_types[: cfg._sliding_window_pattern]]}
    return params, extra


def convert(model: BenchModel) -> None:
    """Write tokenizer.json, checkpoint.pth, params.json (and gemma3.json) for export_llm."""
    import torch

    if model.name.startswith("qwen2.5"):
        convert_qwen2_5(model)
        return

    out = model.executorch_dir
    out.mkdir(parents=True, exist_ok=True)
    hf, tok = load_hf(model)
    tok.save_pretrained(out)  # tokenizer.json for the runner (the pytorch-tokenizers HF loader)
    cfg = hf.config
    state = hf.state_dict()
    if model.name.startswith("gemma3"):
        sd = rename_state_dict(state, GEMMA3_LAYER_NAMES)
        # Gemma scales embeddings by sqrt(dim) (as an fp32 constant, like transformers) but the
        # tied head uses them unscaled: keep two copies, the input one pre-scaled.
        scale = torch.tensor(cfg.hidden_size ** 0.5, dtype=torch.float32)
        sd["tok_embeddings.weight"] = sd["output.weight"] * scale
        params, extra = gemma3_params(cfg)
        (out / "gemma3.json").write_text(json.dumps(extra, indent=1))
    else:
        sd = rename_state_dict(state, LLAMA_LAYER_NAMES)
        params = llama_params(cfg, qkv_bias=False)
    torch.save({k: v.contiguous() for k, v in sd.items()}, out / "checkpoint.pth")
    (out / "params.json").write_text(json.dumps(params, indent=1))
    meta = {"get_bos_id": tok.bos_token_id if tok.bos_token_id is not None else -1,
            "get_eos_ids": eos_ids(model, tok)}
    (out / "metadata.json").write_text(json.dumps(meta))
    # For run_executorch.py: whether prompts start with BOS, without loading the tokenizer there.
    (out / "prompt_format.json").write_text(json.dumps({"adds_bos": adds_bos(tok)}))
    print(f"converted {model.name} -> {out}", file=sys.stderr)


# export_llm's model class for each Qwen2.5 size (the architecture; the weights come from base.checkpoint)
QWEN2_5_MODEL_CLASSES = {"qwen2.5-coder-0.5b": "qwen2_5_0_5b", "qwen2.5-coder-1.5b": "qwen2_5_1_5b"}


def qwen2_5_export_command(model: BenchModel) -> list[str]:
    """ExecuTorch's own recipe: its coder yaml, with this model's params, checkpoint and output."""
    import executorch

    out = model.executorch_dir
    recipe = (Path(next(iter(executorch.__path__))) / "examples" / "models" / "qwen2_5" / "config"
              / "qwen2_5_coder_xnnpack_q8da4w.yaml")
    # The shipped yaml writes `metadata='{...}'` (command-line syntax), which YAML reads as a key
    # named "metadata='{"get_bos_id"" that the structured config rejects. A copy with the one line
    # as `metadata: '{...}'` is the same recipe.
    text = re.sub(r"^(\s*)metadata=", r"\1metadata: ", recipe.read_text(), flags=re.MULTILINE)
    yaml = out / recipe.name
    yaml.write_text(text)
    # The yaml is not the structured config, so keys it lacks are added with Hydra's "+".
    return [sys.executable, "-m", "executorch.extension.llm.export.export_llm", "--config", str(yaml),
            f"+base.model_class={QWEN2_5_MODEL_CLASSES[model.name]}",
            f"+base.params={out / 'params.json'}", f"+base.checkpoint={out / 'checkpoint.pth'}",
            f"+export.output_dir={out}", f"+export.output_name={model.pte_name}"]


def export_command(model: BenchModel) -> list[str]:
    out = model.executorch_dir
    py = sys.executable
    if model.name.startswith("qwen2.5"):
        return qwen2_5_export_command(model)
    if model.name.startswith("gemma3"):
        extra = json.loads((out / "gemma3.json").read_text())
        entry = [py, str(Path(__file__).with_name("executorch_gemma3.py")), "base.model_class=llama3",
                 "model.local_global_attention=[" + ",".join(str(x) for x in extra["pattern"]) + "]"]
    else:
        entry = [py, "-m", "executorch.extension.llm.export.export_llm", "base.model_class=smollm2"]
    meta = (out / "metadata.json").read_text()
    return entry + [
        f"base.params={out / 'params.json'}", f"base.checkpoint={out / 'checkpoint.pth'}",
        f"base.metadata='{meta}'",
        "model.use_kv_cache=True", "model.use_sdpa_with_kv_cache=True", "model.dtype_override=fp32",
        f"export.max_seq_length={MAX_SEQ_LENGTH}", f"export.max_context_length={MAX_CONTEXT_LENGTH}",
        "quantization.qmode=8da4w", f"quantization.group_size={GROUP_SIZE}",
        "backend.xnnpack.enabled=True", "backend.xnnpack.extended_ops=True",
        f"export.output_dir={out}", f"export.output_name={model.pte_name}",
    ]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True)
    p.add_argument("--convert-only", action="store_true")
    p.add_argument("--print-command", action="store_true", help="print the export_llm command and exit")
    args = p.parse_args()
    model = get_model(args.model)
    if not (model.executorch_dir / "checkpoint.pth").exists():
        convert(model)
    if args.convert_only:
        return
    cmd = export_command(model)
    print(" ".join(cmd), file=sys.stderr)
    if args.print_command:
        return
    t0 = time.perf_counter()
    # Hydra changes into an output folder of its own: run from bench-out so it lands there.
    subprocess.run(cmd, check=True, cwd=model.executorch_dir)
    size = model.pte_path.stat().st_size
    print(json.dumps({"model": model.name, "pte": str(model.pte_path), "bytes": size,
                      "export_seconds": round(time.perf_counter() - t0, 1)}))


if __name__ == "__main__":
    main()
