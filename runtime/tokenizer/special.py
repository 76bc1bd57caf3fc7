"""Special-token conventions shared by the GGUF and tokenizer.json readers."""

from __future__ import annotations

# Tokens after which a chat model has finished its turn. Generation stops on these as well as
# on the model's eos token; only tokens the vocabulary marks special/control are used.
END_OF_TURN_TOKENS = (
    "<end_of_turn>",  # Gemma
    "<|im_end|>",  # ChatML (Qwen, SmolLM)
    "<|eot_id|>",  # Llama 3
    "<|end|>",  # Phi-3
    "<|endoftext|>",  # GPT-2 style end of document
    "<|end_of_text|>",  # Llama 3 base
    "</s>",  # Llama 2, Mistral
    "<eos>",  # Gemma
)
