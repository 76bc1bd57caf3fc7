"""Token windows for calibration and evaluation, cut from text deterministically."""

from __future__ import annotations

import math
from typing import Any

from edgeflash.base.errors import UserError

MIN_WINDOW_TOKENS = 16
_CHARS_PER_TOKEN = 8  # generous: English prose runs 3-5 characters per token


def token_windows(tokenizer: Any, text: str, n_tokens: int, window_tokens: int, what: str) -> list[list[int]]:
    """About `n_tokens` tokens as windows of at most `window_tokens`, each starting with the
    tokenizer's usual prefix (BOS). Long texts are sampled at evenly spaced places (starting at
    a line break); short ones are used whole."""
    if n_tokens < MIN_WINDOW_TOKENS or window_tokens < MIN_WINDOW_TOKENS:
        raise UserError(f"{what}: need at least {MIN_WINDOW_TOKENS} tokens per window, got n_tokens={n_tokens}, "
                        f"window={window_tokens}")
    n_windows = math.ceil(n_tokens / window_tokens)
    span = window_tokens * _CHARS_PER_TOKEN
    windows: list[list[int]] = []
    if len(text) > n_windows * span * 2:
        step = (len(text) - span) // n_windows
        for i in range(n_windows):
            start = i * step
            newline = text.find("\n", start, start + span // 4)
            start = newline + 1 if newline >= 0 else start
            ids = tokenizer.encode(text[start:start + span])[:window_tokens]
            if len(ids) >= MIN_WINDOW_TOKENS:
                windows.append(ids)
    else:
        ids = tokenizer.encode(text, add_bos=False)
        prefix = tokenizer.encode("")  # BOS (or nothing) as the tokenizer adds it
        body = window_tokens - len(prefix)
        windows = [prefix + ids[i:i + body] for i in range(0, min(len(ids), n_tokens), body)]
        windows = [w for w in windows if len(w) >= MIN_WINDOW_TOKENS]
    total = sum(len(w) for w in windows)
    if total < 4 * MIN_WINDOW_TOKENS:
        raise UserError(f"{what}: the text gives only {total} tokens; need at least {4 * MIN_WINDOW_TOKENS}")
    return windows
