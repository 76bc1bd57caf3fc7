"""Run a model one layer at a time over the calibration windows, on torch, from its source weights.

The hidden states of every window (`[T, d_model]` each) are the only thing carried from one layer
to the next; a layer's weights are dequantized when it runs and dropped when it is done, and the
memory-mapped source pages it touched are handed back to the OS (`release_layer`). Peak memory is
therefore one layer's float weights plus the calibration activations, whatever the model's size.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import torch
from edgeflash.export.statistics import LayerCalibration, layer_statistics
from edgeflash.export.torch_ops import LayerRecorder, WindowContext, dense_values, take_layer
from edgeflash.runtime.families import family
from edgeflash.runtime.families.common import LayerWeights
from edgeflash.runtime.rope import inv_frequencies
from edgeflash.runtime.source import ModelSource
from edgeflash.runtime.tensors import Tensor


@contextmanager
def torch_threads(n: int) -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def head_name(source: ModelSource) -> str:
    return "output.weight" if "output.weight" in source.tensors else "token_embd.weight"


class LayerwiseRunner:
    """Windows run in parallel on `threads` worker threads, each torch op on one thread: torch's
    own thread pool spins between ops, and on a shared 2-core machine that cost 9x (SmolLM2, 512
    tokens: 57 s with two torch threads under load, 6.4 s with one; the workers get both cores
    back without the spinning)."""

    def __init__(self, source: ModelSource, windows: list[list[int]], *, keep_ffn_inputs: bool, threads: int):
        self.source, self.spec, self.threads = source, source.spec, threads
        self.family = family(self.spec.family)
        first = LayerRecorder(keep_ffn_inputs)
        self.recorders = [first] + [LayerRecorder(keep_ffn_inputs, shares=first) for _ in range(threads - 1)]
        self.inv_freq = [inv_frequencies(self.spec, i) for i in range(self.spec.n_layers)]
        self.hidden: list[torch.Tensor] = [torch.empty(0)] * len(windows)  # per window [T, d_model] float32
        self._pool = ThreadPoolExecutor(threads) if threads > 1 else None
        self._each_window(lambda ops, i: self.family.embed(ops, self.spec, source.tensors,
                                                           np.asarray(windows[i], dtype=np.int64)))
        self.tokens = sum(len(w) for w in windows)

    def _each_window(self, fn: Callable[[LayerRecorder, int], torch.Tensor]) -> None:
        """hidden[i] = fn(ops, i) for every window; worker k takes windows k, k + threads, ..."""
        def work(k: int) -> None:
            ops = self.recorders[k]
            with torch.no_grad(), torch_threads(1):
                for i in range(k, len(self.hidden), self.threads):
                    ops.window = i
                    self.hidden[i] = fn(ops, i)

        if self._pool is None:
            work(0)
        else:
            list(self._pool.map(work, range(self.threads)))

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown()

    def run_layer(self, layer: int) -> LayerRun:
        """Advance every window through `layer` and return what it recorded."""
        w = LayerWeights(self.source.tensors, layer)
        self._each_window(lambda ops, i: self.family.block(ops, self.spec, layer, w, self.hidden[i],
                                                           WindowContext(self.inv_freq, self.hidden[i].shape[0])))
        importance, gate_pre, ffn_inputs = take_layer(self.recorders)
        return LayerRun(layer, importance, gate_pre, ffn_inputs, w["ffn_gate.weight"], self.spec.activation,
                        self._output_importance(layer))

    def _output_importance(self, layer: int) -> np.ndarray:
        """E[x^2] per dimension of the layer's output as the next reader sees it: the residual stream
        after `layer`, through the next layer's input norm (the final norm after the last layer).
        It weights the quantization of the layer's down columns, whose blocks run along d_model."""
        nxt = f"blk.{layer + 1}.attn_norm.weight" if layer + 1 < self.spec.n_layers else "output_norm.weight"
        g = torch.from_numpy(np.ascontiguousarray(dense_values(self.source.tensors[nxt]), dtype=np.float32))
        total = torch.zeros(g.shape[0], dtype=torch.float64)
        with torch.no_grad():
            for x in self.hidden:
                h = x * torch.rsqrt(x.square().mean(dim=-1, keepdim=True) + self.spec.norm_eps) * g
                total += h.double().square().sum(dim=0)
        return (total / max(self.tokens, 1)).numpy()

    def calibrate_layer(self, layer: int, targets: list[float], predictor_rank: int,
                        predictor_recall: float = 0.9) -> LayerCalibration:
        return self.run_layer(layer).statistics(targets, predictor_rank, predictor_recall)

    def release_layer(self, layer: int) -> None:
        """Hand the layer's memory-mapped source pages back to the OS (they are re-read if needed)."""
        release_tensors(self.source, [n for n in self.source.tensors if n.startswith(f"blk.{layer}.")])

    def head_importance(self) -> dict[str, np.ndarray]:
        """E[x^2] of the head's input (the final-norm hidden states), without computing any logits."""
        name = head_name(self.source)
        ops = self.recorders[0]
        with torch.no_grad():
            sumsq = None
            for x in self.hidden:
                h = self.family.final_norm(ops, self.spec, self.source.tensors, x).double()
                sumsq = h.square().sum(dim=0) if sumsq is None else sumsq + h.square().sum(dim=0)
        ops.release()
        return {name: (sumsq / max(self.tokens, 1)).numpy()}


@dataclass
class LayerRun:
    """One layer's pass over the calibration windows: what the statistics and the quantizers need."""

    layer: int
    importance: dict[str, np.ndarray]  # tensor name -> E[x^2] per input column
    gate_pre: torch.Tensor  # [T, d_ff] float16
    ffn_inputs: torch.Tensor | None  # [T, d_model] float16
    gate: Tensor  # the layer's source gate weights (the predictor is fit against them)
    activation: str
    output_importance: np.ndarray  # [d_model]: E[x^2] of the layer's output through the next norm

    def statistics(self, targets: list[float], predictor_rank: int, predictor_recall: float = 0.9
                   ) -> LayerCalibration:
        gate_w = dense_values(self.gate) if predictor_rank else None
        with torch.no_grad(), torch_threads(1):
            act_thr, gate_thr, freq, order, predictor = layer_statistics(
                self.layer, self.gate_pre, self.ffn_inputs, gate_w, self.activation,
                targets, predictor_rank, predictor_recall)
        return LayerCalibration(layer=self.layer, importance=self.importance, act_thresholds=act_thr,
                                gate_thresholds=gate_thr, frequency=freq, order=order, predictor=predictor,
                                output_importance=self.output_importance)


def release_tensors(source: ModelSource, names: list[str]) -> None:
    """Drop the pages of these tensors from this process (memory-mapped GGUF sources only)."""
    gguf = source.info.get("gguf")
    if gguf is None:
        return
    rewritten = set(source.info.get("rewritten_tensors", []))
    for name in names:
        if name in gguf.tensors and name not in rewritten:
            gguf.release(name)
