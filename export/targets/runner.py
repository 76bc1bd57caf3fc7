"""Run an export of any target from its manifest: chain the chunks, keep the cache, generate.

    runner = TargetRunner("out/smol-et", threads=2)
    result = runner.generate(runner.tokenizer.encode("Once upon a time"), max_new_tokens=32)

Prompts go through the `prefill` method in pieces of its token count (the last piece padded at
its end when the target's shapes are static; `last` picks the logits of the last real token)
and generation through `decode`. With kv="io" the runner owns the caches and writes each chunk's
new entries at their positions; that also lets it load chunks one at a time
(`resident=False`): each chunk file is opened right before its turn and released after it.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
from edgeflash.base.errors import UserError
from edgeflash.export.targets.chunks import read_manifest
from edgeflash.runtime.spec import ModelSpec


class ChunkSession(Protocol):
    def run(self, method: str, inputs: list[np.ndarray]) -> list[np.ndarray]: ...


def open_session(target: str, path: Path, threads: int) -> ChunkSession:
    from edgeflash.export.targets import require

    require(target)
    if target == "executorch":
        from edgeflash.export.targets.sessions import ExecuTorchSession

        return ExecuTorchSession(path, threads)
    if target == "onnx":
        from edgeflash.export.targets.sessions import OnnxSession

        return OnnxSession(path, threads)
    if target == "coreml":
        from edgeflash.export.targets.sessions import CoreMLSession

        return CoreMLSession(path)
    raise UserError(f"no runner for target {target!r}")


@dataclass
class RunResult:
    tokens: list[int]
    prompt_tokens: int
    prefill_s: float
    decode_s: float

    @property
    def decode_tok_s(self) -> float:
        return (len(self.tokens) - 1) / self.decode_s if self.decode_s > 0 and len(self.tokens) > 1 else 0.0

    @property
    def prefill_tok_s(self) -> float:
        return self.prompt_tokens / self.prefill_s if self.prefill_s > 0 else 0.0


class TargetRunner:
    def __init__(self, path: str | Path, *, threads: int = 2, resident: bool = True):
        self.path = Path(path)
        self.manifest = read_manifest(self.path)
        self.target = self.manifest["target"]
        self.spec = ModelSpec.from_dict(self.manifest["model"]["spec"])
        cache = self.manifest["cache"]
        self.kv, self.cache_len = cache["mode"], int(cache["length"])
        self.prefill_tokens = int(self.manifest["methods"]["prefill"]["tokens"])
        self.static_shapes = bool(self.manifest.get("static_shapes", True))
        self.chunks: list[dict[str, Any]] = self.manifest["chunks"]
        self.threads, self.resident = threads, resident
        if not resident and self.kv == "state":
            raise UserError(f"{self.path}: its chunks keep the KV cache inside (kv=state), so they cannot be "
                            "loaded one at a time; export with --kv io for that")
        self._sessions: list[ChunkSession | None] = [None] * len(self.chunks)
        self.load_s = 0.0
        if resident:
            for i in range(len(self.chunks)):
                self._session(i)
        shape = tuple(cache["shape"])
        self.caches: dict[int, tuple[np.ndarray, np.ndarray]] = (
            {layer: (np.zeros(shape, np.float32), np.zeros(shape, np.float32)) for layer in range(self.spec.n_layers)}
            if self.kv == "io" else {})
        self.pos = 0
        self._tokenizer = None

    @property
    def tokenizer(self):
        if self._tokenizer is None:
            from edgeflash.runtime.tokenizer import Tokenizer

            tok_file = self.path / self.manifest["tokenizer"]["file"]
            self._tokenizer = Tokenizer.from_dict(json.loads(tok_file.read_text(encoding="utf-8")))
        return self._tokenizer

    def _session(self, i: int) -> ChunkSession:
        session = self._sessions[i]
        if session is None:
            t0 = time.perf_counter()
            session = open_session(self.target, self.path / self.chunks[i]["file"], self.threads)
            self.load_s += time.perf_counter() - t0
            if self.resident:
                self._sessions[i] = session
        return session

    def reset(self) -> None:
        """Start a new sequence. Stale cache entries need no clearing: the masks hide every slot
        at or after the first new position until it is written again."""
        self.pos = 0

    def _call(self, method: str, tokens: np.ndarray, real: int) -> np.ndarray:
        """One pass of `tokens` (int64 [T], the first `real` of them real) at self.pos; returns
        the logits [vocab] of the last real token."""
        T = len(tokens)
        positions = np.arange(self.pos, self.pos + T, dtype=np.int64)
        x: np.ndarray = tokens
        for i, chunk in enumerate(self.chunks):
            session = self._session(i)
            inputs = [x, positions]
            if chunk["head"]:
                inputs.append(np.array([real - 1], dtype=np.int64))
            layers = range(*chunk["layers"])
            if self.kv == "io":
                for layer in layers:
                    inputs += list(self.caches[layer])
            outputs = session.run(method, inputs)
            x = outputs[0]
            if self.kv == "io":
                for j, layer in enumerate(layers):
                    k_cache, v_cache = self.caches[layer]
                    k_cache[:, self.pos:self.pos + real] = outputs[1 + 2 * j][:, :real]  # [Hkv, T, D]
                    v_cache[:, self.pos:self.pos + real] = outputs[2 + 2 * j][:, :real]
        self.pos += real
        return np.asarray(x, dtype=np.float32).reshape(-1)

    def feed(self, ids: list[int]) -> np.ndarray:
        """Append `ids` to the sequence; returns the logits [vocab] after the last one."""
        if not ids:
            raise UserError("feed() needs at least one token")
        if self.pos + len(ids) > self.cache_len:
            raise UserError(f"context full: {self.pos} cached + {len(ids)} new tokens > cache length {self.cache_len}")
        logits = None
        i = 0
        while i < len(ids):
            rest = len(ids) - i
            take = min(self.prefill_tokens, rest)
            width = self.prefill_tokens if self.static_shapes else take
            if rest == 1 or self.pos + width > self.cache_len:
                logits = self._call("decode", np.array(ids[i:i + 1], dtype=np.int64), 1)
                i += 1
                continue
            tokens = np.zeros(width, dtype=np.int64)  # padding rows only write slots not yet in use
            tokens[:take] = ids[i:i + take]
            logits = self._call("prefill", tokens, take)
            i += take
        return logits

    def logits_each(self, ids: list[int]) -> np.ndarray:
        """Logits [len(ids), vocab] after each token, fed one at a time through `decode`."""
        return np.stack([self.feed([t]) for t in ids])

    def generate(self, prompt_ids: list[int], max_new_tokens: int, stop_ids: set[int] | None = None) -> RunResult:
        """Greedy continuation of `prompt_ids` from a fresh sequence."""
        stop = set(self.tokenizer.eos_ids) if stop_ids is None else stop_ids
        self.reset()
        t0 = time.perf_counter()
        logits = self.feed(list(prompt_ids))
        out = [int(np.argmax(logits))]
        t1 = time.perf_counter()
        while len(out) < max_new_tokens and out[-1] not in stop and self.pos < self.cache_len:
            out.append(int(np.argmax(self.feed([out[-1]]))))
        t2 = time.perf_counter()
        return RunResult(out, len(prompt_ids), t1 - t0, t2 - t1)
