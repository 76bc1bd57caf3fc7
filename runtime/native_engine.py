"""NativeEngine: the C++ decoder (runtime/native/) behind the Engine contract.

An engine is built from a ModelSource and a weight source, which decides where each weight comes
from: `ResidentWeights` hands over every tensor where it already is (a memory-mapped GGUF or
bundle is read in place); a budgeted run's weights (runtime/budgeted.py) keep part of them
resident and stream the rest from flash. Then each forward pass is one C++ call. Formats the
kernels do not run are converted once at load, and so are matrices stored with more bits than
`requantize` asks for; the conversions are reported in the stats.
"""

from __future__ import annotations

import mmap
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np
from edgeflash import kernels
from edgeflash.base.errors import ModelFormatError, UserError
from edgeflash.kernels import _native
from edgeflash.kernels.formats import KERNEL_FORMATS, REQUANTIZE_FALLBACK, REQUANTIZE_FORMATS, get_format
from edgeflash.runtime.bundle.arena import ArenaTensor
from edgeflash.runtime.distributed.shard import vocab_rows
from edgeflash.runtime.native_config import engine_options, engine_shape, layer_shapes
from edgeflash.runtime.source import ModelSource
from edgeflash.runtime.tensors import Tensor, dequantize_raw

# Per-layer tensor name (after "blk.N.") -> the engine's slot name, from the C++ slot table.
LAYER_SLOTS: dict[str, str] = {tensor: slot for slot, tensor in _native.layer_slots()}
MATRIX_SLOTS = frozenset(slot for slot, _ in _native.layer_slots()[:_native.MATRIX_SLOTS])
ATTENTION_CHUNK = 64  # cache slots the attention kernel reduces together (kChunk in kernels/src/attention.cpp)
REQUANTIZE_ROWS = 4096  # rows converted at a time: the float copy stays a few MB whatever the matrix


def _file_map(raw: np.ndarray) -> mmap.mmap | None:
    """The read-only file mapping `raw` is a view into, if any."""
    owner = raw
    while owner is not None and not isinstance(owner, mmap.mmap):
        owner = getattr(owner, "base", None) if not isinstance(owner, memoryview) else owner.obj
    return owner


def _file_backed(raw: np.ndarray) -> bool:
    """Whether `raw` is a view into a read-only file mapping, whose pages may be dropped from this
    process (they are re-read from the page cache if touched again)."""
    return _file_map(raw) is not None and hasattr(mmap, "MADV_DONTNEED")


def _own(raw: np.ndarray) -> bool:
    """Whether `raw` is this process's writable memory, not a file's (what may be laid out in place)."""
    return raw.flags.writeable and _file_map(raw) is None


def _drop_file_pages(raw: np.ndarray) -> None:
    """Drops this process's pages of the whole pages inside `raw`'s bytes of a file mapping. A page
    fault on a file in the page cache may map a whole large folio, well past the bytes read: the
    pages of tensors never read, or already copied, would otherwise stay resident."""
    owner = _file_map(raw)
    if owner is None or not hasattr(mmap, "MADV_DONTNEED"):
        return
    offset = raw.ctypes.data - np.frombuffer(owner, np.uint8).ctypes.data
    page = mmap.PAGESIZE
    start, end = -(-offset // page) * page, (offset + raw.nbytes) // page * page
    if end > start:
        owner.madvise(mmap.MADV_DONTNEED, start, end - start)


class WeightSource(Protocol):
    """Where an engine's weights come from."""

    def install(self, engine: NativeEngine) -> None:
        """Hand the weights to `engine` (its `set_tensors`, and the native engine's streaming setup)."""
        ...

    def stats(self, engine: NativeEngine) -> dict[str, Any]:
        """What this source adds to the run statistics."""
        ...


class ResidentWeights:
    """Every tensor resident: matrices the kernels run faster from panels are laid out so at load
    (a copy the engine owns; the file's pages are dropped after), the rest are read in place (a
    memory-mapped file is paged in as it is used)."""

    def __init__(self, tensors: dict[str, Tensor], panels: bool = True):
        self.tensors = tensors
        self.panels = panels

    def install(self, engine: NativeEngine) -> None:
        engine.set_tensors(self.tensors, panels=self.panels)

    def stats(self, engine: NativeEngine) -> dict[str, Any]:
        return {}


class NativeEngine:
    """The fast engine: every heavy op runs in C++ on the hand-written kernels."""

    name = "native"

    def __init__(self, source: ModelSource, *, weights: WeightSource | None = None, threads: int = 2,
                 options: _native.EngineOptions | None = None, requantize: str | None = None, **option_args: Any):
        """`options` (runtime/native_config.engine_options), or the arguments to build them
        (`context_length`, `max_batch`, `kv_format`, `activations`, `head_chunk`). `requantize`
        (q4_0, q8_0 or q3_k): every matrix stored with more bits per weight, or in a format the kernels
        do not run, is converted to it at load (the embedding rows, read one per token, stay as they
        are). q3_k needs rows of a multiple of 256 values: other matrices get q4_0 instead (when
        they are wider than it), listed in `conversions` and in the stats' `converted_formats`."""
        if requantize is not None and requantize not in REQUANTIZE_FORMATS:
            raise UserError(f"requantize = {requantize!r}: expected one of {', '.join(REQUANTIZE_FORMATS)}")
        self.requantize = requantize
        spec = source.spec
        self.source, self.spec, self.tokenizer = source, spec, source.tokenizer
        self.options = options or engine_options(spec, **option_args)
        self.context_length, self.max_batch = self.options.context, self.options.max_batch
        self.activations, self.kv_format, self.head_chunk = (self.options.activations, self.options.kv_format,
                                                             self.options.head_chunk)
        self.threads = threads
        kernels.set_num_threads(threads)
        self.conversions: dict[str, str] = {}
        self.head_in_place = False  # set_tensors laid the head out in place: its bytes are no rows any more
        shape = engine_shape(spec)
        shape.vocab_begin, shape.vocab_end = vocab_rows(source)  # a rank of a split model holds some rows
        try:
            self._engine = _native.Engine(shape, layer_shapes(spec), self.options)
        except ValueError as e:
            raise UserError(f"{source.path}: {e}") from None
        self.tokens: list[int] = []
        self._tree_tokens = np.empty(0, dtype=np.int32)  # of the last forward_tree/extend_tree, until committed
        self._last_logits = np.empty((1, spec.vocab_size), dtype=np.float32)  # decode needs one row
        self.weight_bytes = source.weight_bytes
        for name, t in source.tensors.items():  # wherever an arena's bytes come from, its down format is fixed
            if isinstance(t, ArenaTensor) and t.down_fmt != t.fmt:
                self._engine.set_arena_down_format(int(name.split(".")[1]), t.down_fmt)
        self.weights = weights or ResidentWeights(source.tensors)
        self.weights.install(self)

    @property
    def tied_head_in_place(self) -> bool:
        """Whether the embedding table became the head's panels (its rows must come another way)."""
        return self.head_in_place and self.spec.tied_embeddings

    # -- weights ------------------------------------------------------------------------------------

    def set_tensors(self, t: dict[str, Tensor], *, panels: bool = False, head: bool = True,
                    in_place: bool = False) -> None:
        """Hand the native engine every tensor present in `t` (a budgeted run leaves streamed ones out).
        With `panels`, matrices the kernels run faster from the panel layout are copied into it, and
        the pages of the file they were read from are dropped (the embedding rows stay in place).
        With `in_place` too, the matrices' own buffers (this process's writable memory, shared with
        nothing) are laid out in panels instead of copied: their bytes are then panels, not rows. A
        tied embedding laid out so as the head is no embedding any more: the caller gives the engine
        its rows another way (BudgetedWeights reads them on demand). Without `head`, the caller
        installs a head of its own (a draft model's shortlist): a tied embedding then stays an
        embedding, not also laid out as a head nobody reads."""
        native = self._engine
        head_tensor = t.get("output.weight") if not self.spec.tied_embeddings else t.get("token_embd.weight")
        if head and head_tensor is not None:
            raw, fmt, rows, cols = self._matrix(head_tensor)
            own = in_place and _own(raw)
            # in place, a head that is not the process's own memory stays in rows (no copy)
            laid_out = native.set_head(raw, fmt, rows, cols, panels=panels and (own or not in_place),
                                       drop_source=_file_backed(head_tensor.raw), in_place=own)
            self.head_in_place = laid_out and own
        if "token_embd.weight" in t and not self.tied_head_in_place:
            # only rows are read from it, unless it is also the head installed here
            rows_only = not (head and self.spec.tied_embeddings)
            native.set_embedding(*self._matrix(t["token_embd.weight"], rows_only=rows_only))
        if "output_norm.weight" in t:
            native.set_output_norm(self._vector(t["output_norm.weight"]))
        for layer in range(self.spec.n_layers):
            prefix = f"blk.{layer}."
            for tensor, slot in LAYER_SLOTS.items():
                if prefix + tensor not in t:
                    continue
                if slot in MATRIX_SLOTS:
                    w = t[prefix + tensor]
                    raw, fmt, rows, cols = self._matrix(w)
                    native.set_matrix(layer, slot, raw, fmt, rows, cols, getattr(w, "stride", 0), panels=panels,
                                      drop_source=_file_backed(w.raw), in_place=in_place and _own(raw))
                else:
                    native.set_vector(layer, slot, self._vector(t[prefix + tensor]))
            if panels:  # what the layer's faults mapped besides the pages read: back to the file
                for name, w in t.items():
                    if name.startswith(prefix) and w.raw.flags.c_contiguous:
                        _drop_file_pages(w.raw)

    def _matrix(self, tensor: Tensor, rows_only: bool = False) -> tuple[np.ndarray, str, int, int]:
        """(raw bytes, format, rows, cols), converting formats the kernels do not run and, with
        `requantize`, formats with more bits per weight than it (not a matrix that only gives rows)."""
        raw, fmt = tensor.raw, tensor.fmt
        if isinstance(tensor, ArenaTensor):  # arenas are in kernel formats, laid out by the export
            return np.ascontiguousarray(raw), fmt, tensor.rows, tensor.cols
        target = None
        if fmt not in KERNEL_FORMATS:
            target = "q8_0" if tensor.cols % 32 == 0 else "f16"
        wanted = self.requantize
        if wanted and tensor.cols % get_format(wanted).block_elems:
            wanted = REQUANTIZE_FALLBACK
        if (wanted and not rows_only and tensor.cols % 32 == 0
                and (target or get_format(fmt).bits_per_weight > get_format(wanted).bits_per_weight)):
            target = wanted
        if target is None:
            return np.ascontiguousarray(raw), fmt, tensor.rows, tensor.cols
        raw = self._convert(tensor, target)
        self.conversions[tensor.name] = f"{fmt}->{target}"
        if wanted != self.requantize and target == wanted:  # the fallback
            self.conversions[tensor.name] += f" ({tensor.cols} columns: {self.requantize} needs a multiple of "\
                                             f"{get_format(self.requantize).block_elems})"
        self.weight_bytes += raw.nbytes - tensor.nbytes
        return raw, target, tensor.rows, tensor.cols

    @staticmethod
    def _convert(tensor: Tensor, target: str) -> np.ndarray:
        """`tensor` in format `target`, converted a slice of rows at a time; the file pages it was
        read from are dropped after each slice."""
        rows, cols = tensor.rows, tensor.cols
        src = tensor.raw.reshape(rows, -1)
        out = np.empty((rows, get_format(target).row_bytes(cols)), dtype=np.uint8)
        for r0 in range(0, rows, REQUANTIZE_ROWS):
            part = src[r0:r0 + REQUANTIZE_ROWS]
            out[r0:r0 + REQUANTIZE_ROWS] = kernels.quantize(dequantize_raw(part, tensor.fmt, cols), target)
            if part.flags.c_contiguous:
                _drop_file_pages(part)
        return out

    @staticmethod
    def _vector(tensor: Tensor) -> np.ndarray:
        return np.ascontiguousarray(tensor.dequantize().reshape(-1), dtype=np.float32)

    # -- running ------------------------------------------------------------------------------------

    def _run(self, *args: Any) -> None:
        try:
            self._engine.forward(*args)
        except RuntimeError as e:  # a streamed read failed or the file changed under us
            raise ModelFormatError(str(e)) from None

    def forward(self, tokens: Sequence[int], *, all_logits: bool = False) -> np.ndarray:
        tokens = np.asarray(tokens, dtype=np.int32)
        if len(self.tokens) + len(tokens) > self.context_length:
            raise UserError(f"context length exceeded: {len(self.tokens)} cached + {len(tokens)} new tokens > "
                            f"{self.context_length}")
        if len(tokens) and (tokens.min() < 0 or tokens.max() >= self.spec.vocab_size):
            raise UserError(f"token id out of range 0..{self.spec.vocab_size - 1}")
        outputs = []
        for start in range(0, len(tokens), self.max_batch):
            chunk = tokens[start:start + self.max_batch]
            n = len(chunk)
            base = self._engine.committed
            positions = np.arange(base, base + n, dtype=np.int32)
            last_chunk = start + n >= len(tokens)
            if all_logits:  # teacher forcing: a transient [n, vocab] buffer per chunk
                rows, logits = np.arange(n, dtype=np.int32), np.empty((n, self.spec.vocab_size), np.float32)
            elif last_chunk:
                rows, logits = np.array([n - 1], dtype=np.int32), self._last_logits
            else:
                rows, logits = np.empty(0, dtype=np.int32), self._last_logits[:0]
            self._run(chunk, positions, None, rows, logits)
            self.tokens.extend(int(t) for t in chunk)
            if len(rows):
                outputs.append(logits if all_logits else logits.copy())
        return np.concatenate(outputs) if outputs else np.empty((0, self.spec.vocab_size), np.float32)

    def tree_room(self) -> int:
        """The most nodes a tree verified now may have and score each node bit for bit as plain
        decoding would: the tree's cache slots stay inside one attention chunk of every layer, where
        its ancestors meet the same chunk of keys their plain-decoding slots would (across a chunk
        boundary the softmax would group the keys otherwise)."""
        committed = self._engine.committed
        room = self.context_length - len(self.tokens)
        for layer in range(self.spec.n_layers):
            window = self.spec.window(layer)
            capacity = min(self.context_length, window + self.max_batch) if window else self.context_length
            slot = committed % capacity
            room = min(room, ATTENTION_CHUNK - slot % ATTENTION_CHUNK, capacity - slot)
        return room

    def forward_tree(self, tokens: Sequence[int], depths: Sequence[int], mask: np.ndarray, *,
                     argmax_only: bool = False) -> np.ndarray:
        """Verify a token tree in one pass: tokens at positions len(self.tokens) + depth, each
        attending to the cache and to its ancestors (`mask[i, j]`: token i sees tree token j).
        Nothing is kept until `commit_tree`. Returns logits [n, vocab], or with `argmax_only` each
        node's most likely next token [n] (no [n, vocab] buffer: what greedy verification needs)."""
        tokens = np.asarray(tokens, dtype=np.int32)
        n = len(tokens)
        if len(self.tokens) + n > self.context_length:  # each node holds a cache slot until commit
            raise UserError(f"context length exceeded: {len(self.tokens)} cached + a tree of {n} tokens "
                            f"> {self.context_length}")
        positions = (np.asarray(depths, dtype=np.int32) + self._engine.committed).astype(np.int32)
        out = np.empty(n, dtype=np.int32) if argmax_only else np.empty((n, self.spec.vocab_size), dtype=np.float32)
        self._run(tokens, positions, np.ascontiguousarray(mask, dtype=np.uint8), np.arange(n, dtype=np.int32), out)
        self._tree_tokens = tokens
        return out

    def extend_tree(self, tokens: Sequence[int], depths: Sequence[int], mask: np.ndarray) -> np.ndarray:
        """Grow the tree of the forward_tree/extend_tree calls since the last commit by `tokens`, at
        positions len(self.tokens) + depth, each attending to the cache and to its ancestors among the
        tree's tokens (`mask[i, j]`: new token i sees tree token j, the earlier calls' first; j runs
        over all of them). Returns their logits [n, vocab]. What a draft model drafting a tree one
        level at a time runs; the tree, old and new tokens together, must fit in max_batch."""
        tokens = np.asarray(tokens, dtype=np.int32)
        n, base = len(tokens), self._engine.tree_size  # a forward or truncate since dropped the tree
        if len(self.tokens) + base + n > self.context_length:
            raise UserError(f"context length exceeded: {len(self.tokens)} cached + a tree of {base + n} tokens "
                            f"> {self.context_length}")
        positions = (np.asarray(depths, dtype=np.int32) + self._engine.committed).astype(np.int32)
        out = np.empty((n, self.spec.vocab_size), dtype=np.float32)
        self._run(tokens, positions, np.ascontiguousarray(mask, dtype=np.uint8), np.arange(n, dtype=np.int32), out,
                  True)
        self._tree_tokens = np.concatenate([self._tree_tokens[:base], tokens])
        return out

    def commit_tree(self, path: Sequence[int]) -> None:
        """Keep the keys/values of the tree nodes on `path` (indices, root first)."""
        path = np.asarray(path, dtype=np.int32)
        self._engine.commit(path)
        self.tokens.extend(int(self._tree_tokens[i]) for i in path)

    def truncate(self, n_tokens: int) -> None:
        kept = self._engine.truncate(n_tokens)
        del self.tokens[kept:]

    def reset(self) -> None:
        self.truncate(0)

    def stats(self) -> dict[str, Any]:
        mem = self._engine.memory()
        out = {"engine": self.name, "threads": self.threads, "activations": self.activations,
               "weight_bytes": self.weight_bytes, "kv_cache_bytes": mem.kv_cache, "kv_cache_format": self.kv_format,
               "activation_bytes": mem.activations + self._last_logits.nbytes,
               "laid_out_bytes": self._engine.laid_out_bytes,
               "laid_out_in_place_bytes": self._engine.laid_out_in_place_bytes}
        reader = self._engine.reader_stats()
        if reader is not None:  # cumulative since loading; a generation reports its own share
            out.update({"flash_bytes_read": reader.bytes_read, "io_wait_s": round(reader.wait_s, 6)})
        if self.conversions:
            out["converted_tensors"] = len(self.conversions)
            kinds: dict[str, int] = {}  # {"q4_k->q3_k": 168, "q4_1->q4_0 (576 columns: q3_k needs ...)": 30}
            for how in self.conversions.values():
                kinds[how] = kinds.get(how, 0) + 1
            out["converted_formats"] = kinds
        out.update(self.weights.stats(self))
        return out

    def close(self) -> None:
        self.reset()
