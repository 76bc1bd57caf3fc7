"""Named quantization schemes, and the `mixed:` syntax for per-role rules.

    get_scheme("q4_0")                                  # a registered name
    get_scheme("mixed:attention=q8_0,ffn=q4_0")         # per-role rules; other roles keep
    get_scheme("mixed:*=q8_0,ffn=q4_lut/weighted")      # role=format[/method][@group_size]
    register_scheme("my-scheme", lambda: QuantConfig(...))
"""

from __future__ import annotations

from collections.abc import Callable

from edgeflash.export.quant.config import (
    ARENA_KEEP,
    RULE_FORMATS,
    QuantConfig,
    QuantConfigError,
    Rule,
    default_method,
)
from edgeflash.export.quant.llama_names import LLAMA_CPP_SCHEMES, llama_cpp_scheme, unmapped_message

_REGISTRY: dict[str, Callable[[], QuantConfig]] = {}


def register_scheme(name: str, factory: Callable[[], QuantConfig]) -> None:
    """Add a named scheme (a factory, so every caller gets its own config object)."""
    if not name or name.startswith("mixed:"):
        raise ValueError(f"scheme name {name!r} is reserved or empty")
    _REGISTRY[name] = factory


def list_schemes() -> list[str]:
    return list(_REGISTRY)


def resolve_config(quant: str | QuantConfig, group_size: int | None) -> QuantConfig:
    """The config an export runs with: a scheme name or a config, at the given group size."""
    config = quant if isinstance(quant, QuantConfig) else get_scheme(quant)
    return config.with_group_size(group_size)


def get_scheme(name: str) -> QuantConfig:
    """A QuantConfig by registered name or `mixed:` rule list."""
    if isinstance(name, QuantConfig):
        return name
    if not isinstance(name, str):
        raise QuantConfigError(f"quant scheme must be a name or a QuantConfig, got {type(name).__name__}")
    if name.startswith("mixed:"):
        return parse_mixed(name)
    factory = _REGISTRY.get(name)
    if factory is None:
        mapped = llama_cpp_scheme(name)  # llama.cpp's names (Q4_K_M, Q8_0...) where they map
        if mapped is not None:
            return get_scheme(mapped)
        refusal = unmapped_message(name)
        if refusal:
            raise QuantConfigError(refusal)
        raise QuantConfigError(f"unknown quant scheme {name!r}; known: {', '.join(_REGISTRY)}, llama.cpp's "
                               f"{', '.join(n.upper() for n in LLAMA_CPP_SCHEMES)}, or mixed:ROLE=FORMAT,... "
                               "(roles: embedding, head, attention, ffn, norm, *)")
    return factory()


def parse_mixed(text: str) -> QuantConfig:
    """`mixed:role=format[/method][@group],...`; roles not named keep the source tensors as they
    are, norms stay f32 unless `norm=keep` is given."""
    body = text[len("mixed:"):].strip()
    if not body:
        raise QuantConfigError(f"quant scheme {text!r}: expected rules after 'mixed:', e.g. mixed:ffn=q4_0")
    rules: list[Rule] = []
    seen: set[str] = set()
    for item in body.split(","):
        role, sep, value = item.strip().partition("=")
        role = role.strip()
        if not sep or not value.strip():
            raise QuantConfigError(f"quant scheme {text!r}: {item!r} is not ROLE=FORMAT")
        if role in seen:
            raise QuantConfigError(f"quant scheme {text!r}: role {role!r} is given twice")
        seen.add(role)
        value, _, group = value.strip().partition("@")
        fmt, _, method = value.partition("/")
        fmt = fmt.strip()
        if fmt not in RULE_FORMATS:
            raise QuantConfigError(f"quant scheme {text!r}: unknown format {fmt!r} for role {role!r} "
                                   f"(expected one of {', '.join(RULE_FORMATS)})")
        group_size = None
        if group:
            try:
                group_size = int(group)
            except ValueError:
                raise QuantConfigError(f"quant scheme {text!r}: group size {group!r} is not an integer") from None
        rules.append(Rule(role, fmt, method.strip() or default_method(fmt), _default_fallback(fmt), group_size))
    # Exact roles before "*", in the order given; norms f32 unless told otherwise; the rest keep.
    ordered = [r for r in rules if r.role != "*"]
    if "norm" not in seen:
        ordered.insert(0, Rule("norm", "f32"))
    ordered += [r for r in rules if r.role == "*"] or [Rule("*", "keep", "copy")]
    return QuantConfig(scheme=text, rules=ordered)


def _default_fallback(fmt: str) -> str | None:
    # K-quants need rows of 256 values; q5_0 is ggml's own choice for rows that cannot take them.
    return "q5_0" if fmt == "q4_k" else None


def _uniform(name: str, fmt: str, method: str, description: str, fallback: str | None = None) -> None:
    register_scheme(name, lambda: QuantConfig(
        scheme=name, description=description,
        rules=[Rule("norm", "f32"), Rule("*", fmt, method, fallback)]))


register_scheme("keep", lambda: QuantConfig(
    scheme="keep", description="every source tensor copied byte for byte (lossless)",
    rules=[Rule("*", "keep", "copy")]))
register_scheme("keep-arena", lambda: QuantConfig(
    scheme="keep-arena", neuron_format=ARENA_KEEP,
    description="every source tensor copied byte for byte, the FFN stored once as its neuron arena: the "
                "source's gate and up rows as they are, down columns in q8_0",
    rules=[Rule("*", "keep", "copy")]))
_uniform("f16", "f16", "rtn", "every matrix in f16")
_uniform("q8_0", "q8_0", "rtn", "every matrix in q8_0 (8.5 bits per weight)")
_uniform("q4_0", "q4_0", "weighted", "every matrix in q4_0 (4.5 bits per weight), scales chosen by "
         "activation-weighted error on calibration text")
_uniform("q4_0-rtn", "q4_0", "rtn", "every matrix in q4_0, round-to-nearest (ggml's rounding)")
_uniform("q4_1", "q4_1", "weighted", "every matrix in q4_1 (5 bits per weight), scale and offset chosen by "
         "activation-weighted error")
_uniform("q4_1-rtn", "q4_1", "rtn", "every matrix in q4_1, round-to-nearest")
_uniform("q5_0", "q5_0", "weighted", "every matrix in q5_0 (5.5 bits per weight), scales chosen by "
         "activation-weighted error")
_uniform("q4_k", "q4_k", "weighted", "every matrix in q4_k (4.5 bits per weight); rows that are not a multiple "
         "of 256 values fall back to q5_0", fallback="q5_0")
_uniform("q3_k", "q3_k", "rtn", "every matrix in q3_k (3.44 bits per weight), a least-squares scale per 16 "
         "values; rows that are not a multiple of 256 values fall back to q4_0", fallback="q4_0")
_uniform("q4_lut", "q4_lut", "weighted", "every matrix in q4_lut (16 levels per row, ~4.4 bits per weight) by "
         "sensitivity-weighted per-row k-means")
register_scheme("q4_0-mixed", lambda: QuantConfig(
    scheme="q4_0-mixed", description="embedding, head and attention in q8_0, FFN in calibrated q4_0",
    rules=[Rule("norm", "f32"), Rule("embedding", "q8_0"), Rule("head", "q8_0"), Rule("attention", "q8_0"),
           Rule("ffn", "q4_0", "weighted")]))
register_scheme("q4_lut-mixed", lambda: QuantConfig(
    scheme="q4_lut-mixed", description="embedding, head and attention in q8_0, FFN in q4_lut (weighted k-means)",
    rules=[Rule("norm", "f32"), Rule("embedding", "q8_0"), Rule("head", "q8_0"), Rule("attention", "q8_0"),
           Rule("ffn", "q4_lut", "weighted")]))
