"""The decoder as a torch module with static shapes, built from a ModelSpec and target weights.

It computes what `runtime/families/{llama,gemma3}.py` compute (the numpy forward is the oracle)
with the family differences as spec flags: q/k/v biases, QK-norm, sandwich norms, the gated
activation, the embedding scale, per-layer RoPE bases, sliding windows and the logit soft-cap.
One module is one chunk: a run of consecutive layers, plus the embedding on the first chunk and
the final norm and head on the last.

Static shapes for export:
- the KV cache has a fixed length `cache_len` and is indexed by position (slot = position);
  sliding-window layers see the same cache through a mask (key visible when
  `0 <= q_pos - k_pos < window`), so no ring-buffer bookkeeping is needed below `cache_len`;
- `kv="state"`: the cache is a module buffer updated in place (ExecuTorch mutable buffers,
  Core ML states); `kv="io"`: the caches are inputs holding the earlier positions and only the
  new entries are outputs, the caller writes them into its own cache (ONNX Runtime, and chunks
  loaded one at a time, which cannot keep state between loads);
- the head chunk takes `last` (int64 [1]): the row whose logits are returned, so a prefill
  chunk padded at its end still returns the logits of its last real token.

How a weight is applied (plain float, torchao quantized tensor, a custom op that becomes an ONNX
contrib op) is the target's choice, through `WeightOps`.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np
import torch
from edgeflash.export.targets.weights import TargetWeight
from edgeflash.runtime.rope import inv_frequencies
from edgeflash.runtime.spec import ModelSpec
from torch import nn
from torch.nn import functional as F


class WeightOps(Protocol):
    """How a target applies its weights inside the graph."""

    def linear(self, w: TargetWeight, bias: TargetWeight | None) -> nn.Module: ...
    def embedding(self, w: TargetWeight) -> nn.Module: ...


class DenseLinear(nn.Module):
    def __init__(self, w: TargetWeight, bias: TargetWeight | None):
        super().__init__()
        self.weight = nn.Parameter(torch.from_numpy(np.ascontiguousarray(w.values())), requires_grad=False)
        self.bias = None if bias is None else nn.Parameter(torch.from_numpy(bias.values().copy()),
                                                           requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


class DenseEmbedding(nn.Module):
    def __init__(self, w: TargetWeight):
        super().__init__()
        self.weight = nn.Parameter(torch.from_numpy(np.ascontiguousarray(w.values())), requires_grad=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return F.embedding(tokens, self.weight)


class DenseOps:
    """Float weights: the values each target weight stands for."""

    def linear(self, w: TargetWeight, bias: TargetWeight | None) -> nn.Module:
        return DenseLinear(w, bias)

    def embedding(self, w: TargetWeight) -> nn.Module:
        return DenseEmbedding(w)


class RMSNorm(nn.Module):
    """x / sqrt(mean(x^2) + eps) * w over the last dimension (w is the multiplier itself)."""

    def __init__(self, w: TargetWeight, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.from_numpy(w.values().astype(np.float32)), requires_grad=False)
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # The mean as a 4-D [1, rows, d, 1] average over its last two dims: XNNPACK runs that
        # one as a pooling op, while a mean over the last dim of a 2-D/3-D tensor falls back to
        # the portable kernels and splits the delegated graph.
        d = x.shape[-1]
        ms = torch.mean((x * x).reshape(1, -1, d, 1), dim=(2, 3), keepdim=True).reshape(*x.shape[:-1], 1)
        return x * torch.rsqrt(ms + self.eps) * self.weight


class Attention(nn.Module):
    def __init__(self, spec: ModelSpec, layer: int, w: dict[str, TargetWeight], ops: WeightOps,
                 cache_len: int, kv: str, cache_write: str = "index"):
        super().__init__()
        p = f"blk.{layer}."
        self.spec, self.layer, self.kv, self.cache_len = spec, layer, kv, cache_len
        self.cache_write = cache_write
        self.q = ops.linear(w[p + "attn_q.weight"], w.get(p + "attn_q.bias"))
        self.k = ops.linear(w[p + "attn_k.weight"], w.get(p + "attn_k.bias"))
        self.v = ops.linear(w[p + "attn_v.weight"], w.get(p + "attn_v.bias"))
        self.o = ops.linear(w[p + "attn_output.weight"], None)
        self.q_norm = RMSNorm(w[p + "attn_q_norm.weight"], spec.norm_eps) if spec.qk_norm else None
        self.k_norm = RMSNorm(w[p + "attn_k_norm.weight"], spec.norm_eps) if spec.qk_norm else None
        if kv == "state":
            shape = (spec.n_kv_heads, cache_len, spec.head_dim)
            self.register_buffer("k_cache", torch.zeros(shape))  # [Hkv, C, D]
            self.register_buffer("v_cache", torch.zeros(shape))
            if cache_write == "one_hot":
                self.register_buffer("slots", torch.arange(cache_len, dtype=torch.int64), persistent=False)

    def write_cache(self, input_pos: torch.Tensor, k_new: torch.Tensor, v_new: torch.Tensor) -> None:
        """Store the new entries [Hkv, T, D] at slots input_pos, in place."""
        if self.cache_write == "index":
            self.k_cache[:, input_pos] = k_new
            self.v_cache[:, input_pos] = v_new
            return
        # "one_hot": the same update as products with a [T, C] selection matrix, for converters
        # without a usable indexed assignment (Core ML); each slot takes 1 * new or 1 * old.
        select = (input_pos.unsqueeze(1) == self.slots.unsqueeze(0)).to(torch.float32)  # [T, C]
        keep = (1.0 - select.sum(0)).view(1, -1, 1)  # [1, C, 1]
        self.k_cache.copy_(self.k_cache * keep + torch.matmul(select.t(), k_new))
        self.v_cache.copy_(self.v_cache * keep + torch.matmul(select.t(), v_new))

    def rope(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """Rotate-half RoPE on the first 2*half dims of each head. x: [T, H, D]."""
        half = cos.shape[-1]
        x1, x2 = x[..., :half], x[..., half:2 * half]
        rotated = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)
        if x.shape[-1] > 2 * half:
            rotated = torch.cat([rotated, x[..., 2 * half:]], dim=-1)
        return rotated

    def forward(self, h: torch.Tensor, input_pos: torch.Tensor, mask: torch.Tensor, cos: torch.Tensor,
                sin: torch.Tensor, k_cache: torch.Tensor | None = None, v_cache: torch.Tensor | None = None):
        """h: [T, d_model]; input_pos: [T]; mask: [G*T, C] (or [G*T, C+T]) additive, 0 or -inf,
        rows ordered (g, t); cos, sin: [T, 1, half].
        Returns [T, d_model] and, with kv="io", the new keys and values [Hkv, T, D]."""
        spec = self.spec
        T = h.shape[0]
        q = self.q(h).view(T, spec.n_heads, spec.head_dim)
        k = self.k(h).view(T, spec.n_kv_heads, spec.head_dim)
        v = self.v(h).view(T, spec.n_kv_heads, spec.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = self.rope(q, cos, sin), self.rope(k, cos, sin)
        k_new, v_new = k.transpose(0, 1), v.transpose(0, 1)  # [Hkv, T, D]
        group = spec.gqa_group
        # Query heads h = kv * group + g share kv head `kv`: rows ordered (g, t) per kv head.
        qg = q.view(T, spec.n_kv_heads, group, spec.head_dim).permute(1, 2, 0, 3)  # [Hkv, G, T, D]
        qg = qg.reshape(spec.n_kv_heads, group * T, spec.head_dim)
        if self.kv == "state":
            self.write_cache(input_pos, k_new, v_new)
            scores = torch.matmul(qg, self.k_cache.transpose(1, 2)) * spec.attn_scale  # [Hkv, G*T, C]
            probs = torch.softmax(scores + mask, dim=-1)
            out = torch.matmul(probs, self.v_cache)  # [Hkv, G*T, D]
        else:
            # The caller's cache holds the earlier positions only; attend to it and to the new
            # entries side by side instead of writing one into a copy of the other.
            scores = torch.cat([torch.matmul(qg, k_cache.transpose(1, 2)),  # [Hkv, G*T, C]
                                torch.matmul(qg, k.permute(1, 2, 0))], dim=-1) * spec.attn_scale  # + [.., T]
            probs = torch.softmax(scores + mask, dim=-1)
            out = (torch.matmul(probs[..., :self.cache_len], v_cache)
                   + torch.matmul(probs[..., self.cache_len:], v_new))  # [Hkv, G*T, D]
        out = out.view(spec.n_kv_heads, group, T, spec.head_dim).permute(2, 0, 1, 3).reshape(T, spec.q_dim)
        out = self.o(out)
        return (out, None, None) if self.kv == "state" else (out, k_new, v_new)


class FeedForward(nn.Module):
    def __init__(self, spec: ModelSpec, layer: int, w: dict[str, TargetWeight], ops: WeightOps):
        super().__init__()
        p = f"blk.{layer}."
        self.gate = ops.linear(w[p + "ffn_gate.weight"], None)
        self.up = ops.linear(w[p + "ffn_up.weight"], None)
        self.down = ops.linear(w[p + "ffn_down.weight"], None)
        self.activation = spec.activation

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        gate = self.gate(h)  # [T, d_ff]
        act = F.silu(gate) if self.activation == "silu" else F.gelu(gate, approximate="tanh")
        return self.down(act * self.up(h))


class Block(nn.Module):
    def __init__(self, spec: ModelSpec, layer: int, w: dict[str, TargetWeight], ops: WeightOps,
                 cache_len: int, kv: str, cache_write: str):
        super().__init__()
        p = f"blk.{layer}."
        self.attn_norm = RMSNorm(w[p + "attn_norm.weight"], spec.norm_eps)
        self.attn = Attention(spec, layer, w, ops, cache_len, kv, cache_write)
        self.ffn_norm = RMSNorm(w[p + "ffn_norm.weight"], spec.norm_eps)
        self.ffn = FeedForward(spec, layer, w, ops)
        self.sandwich = spec.sandwich_norm
        if self.sandwich:  # Gemma 3: norms on the sublayer outputs too
            self.post_attn_norm = RMSNorm(w[p + "post_attention_norm.weight"], spec.norm_eps)
            self.post_ffn_norm = RMSNorm(w[p + "post_ffw_norm.weight"], spec.norm_eps)

    def forward(self, x, input_pos, mask, cos, sin, k_cache=None, v_cache=None):
        attn, k_new, v_new = self.attn(self.attn_norm(x), input_pos, mask, cos, sin, k_cache, v_cache)
        x = x + (self.post_attn_norm(attn) if self.sandwich else attn)
        ffn = self.ffn(self.ffn_norm(x))
        return x + (self.post_ffn_norm(ffn) if self.sandwich else ffn), k_new, v_new


class ChunkGraph(nn.Module):
    """Layers `layers` (consecutive), with the embedding if `first` and the head if `last_chunk`.

    forward(x, input_pos[, last][, k_cache_i, v_cache_i for each layer when kv="io"]):
    - x: int64 token ids [T] on the first chunk, else float32 hidden states [T, d_model];
    - input_pos: int64 [T] absolute positions (< cache_len);
    - last: int64 [1], head chunk only: which of the T rows to return logits for.
    Returns hidden [T, d_model] or logits [1, vocab], then (kv="io") the new k, v of each layer.
    """

    def __init__(self, spec: ModelSpec, weights: dict[str, TargetWeight], layers: range, *, first: bool,
                 last_chunk: bool, cache_len: int, kv: str, ops: WeightOps, cache_write: str = "index"):
        super().__init__()
        if kv not in ("state", "io"):
            raise ValueError(f"kv must be 'state' or 'io', not {kv!r}")
        if cache_write not in ("index", "one_hot"):
            raise ValueError(f"cache_write must be 'index' or 'one_hot', not {cache_write!r}")
        self.spec, self.layers_range, self.first, self.last_chunk = spec, layers, first, last_chunk
        self.cache_len, self.kv = cache_len, kv
        self.embed = ops.embedding(weights["token_embd.weight"]) if first else None
        self.blocks = nn.ModuleList([Block(spec, i, weights, ops, cache_len, kv, cache_write) for i in layers])
        self.windows = [spec.window(i) for i in layers]
        # One cos/sin table per distinct RoPE frequency set (Gemma 3: local and global layers).
        self.rope_of_layer: list[int] = []
        tables: list[np.ndarray] = []
        for i in layers:
            inv = inv_frequencies(spec, i)
            match = next((j for j, t in enumerate(tables) if np.array_equal(t, inv)), None)
            if match is None:
                tables.append(inv)
                match = len(tables) - 1
                cos, sin = _rope_tables(inv, cache_len)
                self.register_buffer(f"rope_cos_{match}", cos, persistent=False)  # [C, half]
                self.register_buffer(f"rope_sin_{match}", sin, persistent=False)
            self.rope_of_layer.append(match)
        self.n_rope = len(tables)
        self.register_buffer("key_pos", torch.arange(cache_len, dtype=torch.int64), persistent=False)  # [C]
        if last_chunk:
            self.norm = RMSNorm(weights["output_norm.weight"], spec.norm_eps)
            head = weights.get("output.weight") or weights["token_embd.weight"]
            self.head = ops.linear(head, None)

    def masks(self, input_pos: torch.Tensor) -> dict[int, torch.Tensor]:
        """Additive masks per distinct window (0 = the whole context): [T, C] over the cache slots
        (kv="state"), or [T, C + T] over the earlier slots then the new tokens (kv="io")."""
        q_pos = input_pos.unsqueeze(1)  # [T, 1]
        cache_delta = q_pos - self.key_pos.unsqueeze(0)  # [T, C] q_pos - k_pos
        if self.kv == "io":
            earlier = self.key_pos.unsqueeze(0) < input_pos[:1].unsqueeze(1)  # [1, C] slots already cached
            new_delta = q_pos - input_pos.unsqueeze(0)  # [T, T]
        out = {}
        for window in sorted(set(self.windows)):
            visible = cache_delta >= 0
            if window:
                visible = torch.logical_and(visible, cache_delta < window)  # Core ML converts no `&`
            if self.kv == "io":
                visible_new = new_delta >= 0
                if window:
                    visible_new = torch.logical_and(visible_new, new_delta < window)
                visible = torch.cat([torch.logical_and(visible, earlier), visible_new], dim=1)
            additive = torch.where(visible, torch.zeros((), dtype=torch.float32),
                                   torch.full((), float("-inf"), dtype=torch.float32))
            out[window] = additive.repeat(self.spec.gqa_group, 1)  # rows (g, t), as the scores
        return out

    def forward(self, x: torch.Tensor, input_pos: torch.Tensor, *rest: torch.Tensor):
        spec = self.spec
        rest = list(rest)
        last = rest.pop(0) if self.last_chunk else None
        if self.first:
            x = self.embed(x)  # [T, d_model]
            if spec.embedding_scale != 1.0:
                x = x * spec.embedding_scale
        masks = self.masks(input_pos)
        rope = [(getattr(self, f"rope_cos_{j}")[input_pos].unsqueeze(1),  # [T, 1, half]
                 getattr(self, f"rope_sin_{j}")[input_pos].unsqueeze(1)) for j in range(self.n_rope)]
        new_kv: list[torch.Tensor] = []
        for i, block in enumerate(self.blocks):
            cos, sin = rope[self.rope_of_layer[i]]
            if self.kv == "io":
                x, k_new, v_new = block(x, input_pos, masks[self.windows[i]], cos, sin, rest[2 * i], rest[2 * i + 1])
                new_kv += [k_new, v_new]
            else:
                x, _, _ = block(x, input_pos, masks[self.windows[i]], cos, sin)
        if self.last_chunk:
            h = self.norm(torch.index_select(x, 0, last))  # [1, d_model]
            x = self.head(h)  # [1, vocab]
            if spec.final_logit_softcap:
                x = torch.tanh(x / spec.final_logit_softcap) * spec.final_logit_softcap
        return (x, *new_kv) if new_kv else x


def _rope_tables(inv: np.ndarray, cache_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    # Angles in float64 then rounded, as the reference computes them: positions up to thousands
    # times the highest frequency lose digits in float32. inv: [half] float64.
    angles = np.arange(cache_len, dtype=np.float64)[:, None] * inv[None, :]  # [C, half]
    return (torch.from_numpy(np.cos(angles).astype(np.float32)),
            torch.from_numpy(np.sin(angles).astype(np.float32)))


def example_inputs(graph: ChunkGraph, tokens: int) -> tuple[torch.Tensor, ...]:
    """Inputs of the right dtypes and shapes for a call with `tokens` new tokens."""
    spec = graph.spec
    x = (torch.zeros(tokens, dtype=torch.int64) if graph.first
         else torch.zeros(tokens, spec.d_model, dtype=torch.float32))
    args: list[torch.Tensor] = [x, torch.arange(tokens, dtype=torch.int64)]
    if graph.last_chunk:
        args.append(torch.tensor([tokens - 1], dtype=torch.int64))
    if graph.kv == "io":
        for _ in graph.layers_range:
            shape = (spec.n_kv_heads, graph.cache_len, spec.head_dim)
            args += [torch.zeros(shape), torch.zeros(shape)]
    return tuple(args)
