"""Tokenizers for the runtime: pure Python (stdlib, numpy and `regex`; `jinja2` for chat
templates), with the vocabulary held in compact arrays (see `vocab`).

    tok = Tokenizer.from_gguf_metadata(read_metadata("model.gguf"))
    tok = Tokenizer.from_tokenizer_json("model_dir/")        # or a tokenizer.json path / dict
    ids = tok.encode("Hello"); text = tok.decode(ids)
    dec = StreamDecoder(tok); pieces = [dec.push(i) for i in ids] + [dec.flush()]
    prompt = render_chat(tok, [{"role": "user", "content": "Hi"}])
"""

from .chat import CHAT_FORMATS, chat_ids, render_chat
from .stream import StreamDecoder
from .tokenizer import Tokenizer

__all__ = ["CHAT_FORMATS", "StreamDecoder", "Tokenizer", "chat_ids", "render_chat"]
