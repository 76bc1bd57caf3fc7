"""The model's vocabulary as llguidance sees it: every token id's bytes, special tokens marked.

Building it walks the whole vocabulary once (about 1 s and 26 MiB for Qwen2.5's 152k tokens), so
it is kept per tokenizer for as long as the tokenizer lives."""

from __future__ import annotations

import threading
import weakref
from typing import Any

_CACHE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()
# llguidance's convention for a special token's bytes: 0xFF, then its text; ordinary text never
# holds that byte, so a grammar's text can never spell a special token.
SPECIAL_PREFIX = b"\xff"


class _Vocabulary:
    """What llguidance's TokenizerWrapper reads: token bytes, EOS/BOS, special ids, and encode."""

    def __init__(self, tok: Any, vocab_size: int):
        self._tok = tok
        self.eos_token_id = tok.eos_id
        self.bos_token_id = tok.bos_id
        self.special_token_ids: list[int] = []
        self.tokens: list[bytes] = []
        for token_id in range(vocab_size):
            if token_id >= tok.vocab_size:  # rows of the model's head past the tokenizer's vocabulary
                self.tokens.append(b"")
                continue
            data = tok.token_bytes(token_id)
            if tok.is_special(token_id):
                data = SPECIAL_PREFIX + data
                self.special_token_ids.append(token_id)
            self.tokens.append(data)

    def __call__(self, text: str | bytes) -> list[int]:
        if isinstance(text, bytes):
            text = text.decode("utf-8", errors="replace")
        return self._tok.encode(text, add_bos=False, parse_special=False, add_eos=False)


def llg_tokenizer(tok: Any, vocab_size: int) -> Any:
    """llguidance's tokenizer for `tok` with the model's `vocab_size` logits; built once per tokenizer."""
    import llguidance

    with _LOCK:
        cached = _CACHE.get(tok)
        if cached is not None and cached[0] == vocab_size:
            return cached[1]
        vocabulary = _Vocabulary(tok, vocab_size)
        wrapper = llguidance.TokenizerWrapper(vocabulary)
        # No precomputed "slices": they make a mask about 3x faster (0.2 instead of 0.6 ms a token
        # for Qwen2.5's 152k tokens, next to 10-100 ms of decoding) but double the memory (52 MiB
        # instead of 27), and memory is what a device lacks.
        built = llguidance.LLTokenizer(wrapper, n_vocab=vocab_size, eos_token=sorted(tok.eos_ids), slices=[])
        # llguidance has copied the token bytes into its own trie; only `encode` is called later.
        vocabulary.tokens = wrapper.tokens = []
        _CACHE[tok] = (vocab_size, built)
        return built
