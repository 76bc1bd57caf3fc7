"""Structured output: token masks that keep a generation inside a grammar (a JSON schema, a
model's tool-call format), and the tool calls parsed back out of the text.

The masks come from llguidance (a Rust library with no torch or Python dependencies): it walks
the model's own vocabulary, as bytes, against the grammar, so any tokenizer works.

    constraint = Constraint.for_json(tokenizer, vocab_size, {"type": "object"})
    logits = constraint.mask(logits); ...; constraint.accept(token)
"""

from .constraint import Constraint
from .grammars import JSON_OBJECT, json_grammar, tool_grammar
from .tool_calls import ToolCallFormat, tool_call_format

__all__ = ["JSON_OBJECT", "Constraint", "ToolCallFormat", "json_grammar", "tool_call_format", "tool_grammar"]
