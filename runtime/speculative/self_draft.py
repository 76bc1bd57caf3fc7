"""Self-drafting: the target's own first layers, its final norm and a head over the most frequent
tokens (from the bundle's calibration counts) form a small draft model. It shares the target's
weight arrays, so it costs only its KV cache, its work buffers and the head rows."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import numpy as np
from edgeflash.base.errors import UserError
from edgeflash.runtime.native_engine import NativeEngine

DEFAULT_SHORTLIST = 8192
SELF_DRAFT_MAX_BATCH = 16


def frequent_tokens(source, limit: int) -> np.ndarray:
    ids = ((source.info.get("manifest") or {}).get("calibration") or {}).get("token_frequencies", {}).get("ids", [])
    if not ids:
        raise UserError(f"{source.path}: self-drafting needs a bundle's token counts (export it with "
                        "`edgeflash export`); use speculative='lookup' for this model")
    return np.asarray(ids[:limit], dtype=np.int32)


class SelfDraftEngine(NativeEngine):
    name = "self-draft"

    def __init__(self, target: NativeEngine, layers: int, shortlist: int = DEFAULT_SHORTLIST,
                 tensors: dict | None = None):
        spec = target.spec
        if not 1 <= layers < spec.n_layers:
            raise UserError(f"self-draft layers = {layers}: expected 1..{spec.n_layers - 1}")
        tensors = tensors if tensors is not None else target.source.tensors
        self.ids = frequent_tokens(target.source, shortlist)
        head_name = "token_embd.weight" if spec.tied_embeddings else "output.weight"
        head = target.source.tensors[head_name]
        if hasattr(target, "read_rows"):  # a budgeted target: direct reads, no memory map
            self._head_rows = target.read_rows(head_name, self.ids)
        else:
            self._head_rows = np.ascontiguousarray(head.take_rows(self.ids).raw)  # just these rows
        self._head_fmt = head.fmt
        self._embedding_stream = getattr(target, "embedding_stream", None)
        draft_spec = dataclasses.replace(spec, n_layers=layers, layer_kinds=spec.layer_kinds[:layers])
        keep = {n: t for n, t in tensors.items()
                if not n.startswith("blk.") or int(n.split(".")[1]) < layers}
        view = SimpleNamespace(spec=draft_spec, tokenizer=target.tokenizer, tensors=keep, path=target.source.path,
                               weight_bytes=0, info={})
        self.extra_bytes = self._head_rows.nbytes
        super().__init__(view, threads=target.threads, context_length=target.context_length,
                         max_batch=min(target.max_batch, SELF_DRAFT_MAX_BATCH), activations=target.activations,
                         kv_format=target.kv_format)

    def _load_weights(self) -> None:
        t = dict(self.source.tensors)
        t.pop("output.weight", None)
        self._set_weights(t)  # embedding, layers, final norm
        if "token_embd.weight" not in t and self._embedding_stream:  # the target reads rows on demand
            path, direct, embedding = self._embedding_stream
            self._engine.set_streaming(path, direct, 1, 64 * 1024, [], 1, False, embedding)
        self._engine.set_head_shortlist(self._head_rows, self._head_fmt, self.ids)
