"""QuantConfig: which format and method each tensor role gets, as data.

A config is an ordered list of rules (first match wins; role "*" matches every role), plus the
format of the FFN neuron arena. It round-trips through `to_dict`/`from_dict` and JSON and carries
a version, so a bundle records exactly how it was made and other exporters (ExecuTorch, ONNX,
Core ML) can read the same object.

Formats: `keep` (the source tensor's bytes, unchanged), `f32`, `f16`, `q8_0`, `q4_0`, `q4_1`,
`q5_0`, `q4_k`, `q3_k` (GGML block layouts) and `q4_lut` (per-row 16-level table, docs/weight-formats.md).
Methods: `copy` (keep), `rtn` (round to nearest, ggml's rounding), `weighted` (calibrated: the
quantization error of each column is weighted by E[x^2] of the activations that multiply it,
measured on calibration text; for q4_lut this is a weighted per-row k-means).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any

from edgeflash.base.errors import UserError
from edgeflash.export.quant.roles import ROLES, role_of
from edgeflash.kernels.formats import get_format

CONFIG_VERSION = 1
RULE_FORMATS = ("keep", "f32", "f16", "q8_0", "q4_0", "q4_1", "q5_0", "q4_k", "q3_k", "q4_lut")
METHODS = ("copy", "rtn", "weighted")
# Formats whose blocks are 32 values along a row: the ones a neuron arena (rows of d_model) can use.
ARENA_FORMATS = ("f32", "f16", "q8_0", "q4_0", "q4_1", "q5_0", "q4_lut")
# neuron_format "keep": the arena's gate and up rows are the source's rows byte for byte (each is
# already a row of d_model values in its own format), where the arena kernels run that format;
# the down columns, which no source stores, in q8_0 (partition.arena_formats).
ARENA_KEEP = "keep"
_BLOCK_GROUP = {"q8_0": 32, "q4_0": 32, "q4_1": 32, "q5_0": 32, "q4_k": 256, "q3_k": 256}


class QuantConfigError(UserError):
    """A quantization scheme or rule that cannot be used (unknown name, impossible group size...)."""


@dataclass(frozen=True)
class Rule:
    role: str  # one of ROLES, or "*" for every role
    format: str
    method: str = "rtn"
    fallback: str | None = None  # format for tensors whose rows `format` cannot take
    group_size: int | None = None  # values per scale; None = the format's own block size

    def __post_init__(self) -> None:
        where = f"quant rule {self.role}={self.format}"
        if self.role not in ROLES and self.role != "*":
            raise QuantConfigError(f"{where}: unknown role {self.role!r} (expected one of {', '.join(ROLES)} or *)")
        for fmt in (self.format, self.fallback):
            if fmt is not None and fmt not in RULE_FORMATS:
                raise QuantConfigError(f"{where}: unknown format {fmt!r} (expected one of {', '.join(RULE_FORMATS)})")
        if self.method not in METHODS:
            raise QuantConfigError(f"{where}: unknown method {self.method!r} (expected one of {', '.join(METHODS)})")
        if (self.format == "keep") != (self.method == "copy"):
            raise QuantConfigError(f"{where}: method {self.method!r} does not apply; keep uses copy, and copy "
                                   "only keep")
        if self.method == "weighted" and self.format in ("f32", "f16"):
            raise QuantConfigError(f"{where}: method 'weighted' needs a quantized format, not {self.format}")
        if self.role == "norm" and self.format not in ("keep", "f32"):
            raise QuantConfigError(f"{where}: norms stay f32 (or keep); {self.format} is not allowed")
        if self.fallback in ("keep", "q4_k", "q3_k"):
            raise QuantConfigError(f"{where}: fallback must be a format every row length of 32 values can take, "
                                   f"not {self.fallback}")
        if self.group_size is not None:
            self.check_group_size()

    def check_group_size(self) -> None:
        g = self.group_size
        where = f"quant rule {self.role}={self.format}"
        if isinstance(g, bool) or not isinstance(g, int) or g <= 0:
            raise QuantConfigError(f"{where}: group size {g!r} must be a positive integer")
        native = _BLOCK_GROUP.get(self.format)
        if native is None:
            kind = "one table per row" if self.format == "q4_lut" else "no groups"
            raise QuantConfigError(f"{where}: group size {g} is impossible for {self.format}, which has {kind}")
        if g != native:
            raise QuantConfigError(f"{where}: group size {g} is impossible for {self.format}, whose blocks hold "
                                   f"{native} values (bundle formats have fixed groups)")

    def spec(self) -> str:
        """The `role=format[/method]` text `mixed:` schemes are written in."""
        return f"{self.role}={self.format}" + (f"/{self.method}" if self.method != default_method(self.format) else "")


def default_method(fmt: str) -> str:
    if fmt == "keep":
        return "copy"
    return "weighted" if fmt in ("q4_0", "q4_1", "q5_0", "q4_k", "q4_lut") else "rtn"


@dataclass(frozen=True)
class TensorPlan:
    """What happens to one tensor: its final format and method, and why if it differs from the rule."""

    name: str
    role: str
    format: str  # "keep" = the source bytes as they are
    method: str
    rule: Rule
    fallback_from: str | None = None
    reason: str = ""


@dataclass
class QuantConfig:
    scheme: str
    rules: list[Rule]
    version: int = CONFIG_VERSION
    neuron_format: str | None = None  # format of every arena part; None = derived from the ffn rule;
    # ARENA_KEEP = gate and up rows as the source stores them, down columns q8_0
    description: str = ""

    def __post_init__(self) -> None:
        self.rules = [r if isinstance(r, Rule) else Rule(**r) for r in self.rules]
        if not self.rules:
            raise QuantConfigError(f"quant scheme {self.scheme!r} has no rules")
        if self.version > CONFIG_VERSION:
            raise QuantConfigError(f"quant config version {self.version} is newer than this edgeflash reads "
                                   f"({CONFIG_VERSION})")
        if self.neuron_format is not None and self.neuron_format not in (*ARENA_FORMATS, ARENA_KEEP):
            raise QuantConfigError(f"neuron_format {self.neuron_format!r}: expected one of "
                                   f"{', '.join((*ARENA_FORMATS, ARENA_KEEP))}")
        for role in ROLES:
            self.rule_for_role(role)  # every role must be covered

    # -- lookups ---------------------------------------------------------------------------------

    def rule_for_role(self, role: str) -> Rule:
        for rule in self.rules:
            if rule.role in (role, "*"):
                return rule
        raise QuantConfigError(f"quant scheme {self.scheme!r} has no rule for role {role!r}")

    def rule_for(self, tensor_name: str) -> Rule:
        return self.rule_for_role(role_of(tensor_name))

    def plan(self, tensor_name: str, shape: tuple[int, ...]) -> TensorPlan:
        """Format and method for one tensor, applying fallbacks for rows a format cannot take."""
        role = role_of(tensor_name)
        rule = self.rule_for_role(role)
        if rule.format == "keep":
            return TensorPlan(tensor_name, role, "keep", "copy", rule)
        if len(shape) == 1:  # vectors (norms, biases) are never quantized
            return TensorPlan(tensor_name, role, "f32", "rtn", rule,
                              reason="" if rule.format == "f32" else "1-D tensors stay f32")
        cols = shape[-1]
        fmt = rule.format
        if cols % get_format(fmt).block_elems == 0:
            return TensorPlan(tensor_name, role, fmt, rule.method, rule)
        need = get_format(fmt).block_elems
        if rule.fallback is None or cols % get_format(rule.fallback).block_elems:
            raise QuantConfigError(
                f"tensor {tensor_name} has rows of {cols} values: {fmt} needs multiples of {need} and rule "
                f"{rule.role}={fmt} has " + ("no fallback" if rule.fallback is None else
                                             f"fallback {rule.fallback}, which cannot take them either"))
        method = rule.method if rule.fallback not in ("f32", "f16") else "rtn"
        return TensorPlan(tensor_name, role, rule.fallback, method, rule, fallback_from=fmt,
                          reason=f"rows of {cols} values are not a multiple of {need}")

    def arena_format(self) -> str:
        """Format of the gate/up/down rows in the neuron arena (ARENA_KEEP: the source's, resolved
        per layer by partition.arena_formats)."""
        if self.neuron_format:
            return self.neuron_format
        ffn = self.rule_for_role("ffn")
        if ffn.format in ARENA_FORMATS:
            return ffn.format
        if ffn.fallback in ARENA_FORMATS:
            return ffn.fallback
        return "q8_0"  # keep: the source's formats vary per tensor, one 8-bit format serves them all

    @property
    def calibrated(self) -> bool:
        return any(r.method == "weighted" for r in self.rules)

    def rtn_baseline(self) -> QuantConfig | None:
        """The same scheme with round-to-nearest instead of every calibrated method (q4_lut becomes
        q4_0, the round-to-nearest format of the same size): the report's side-by-side baseline."""
        if not self.calibrated:
            return None
        rules = []
        for r in self.rules:
            if r.method == "weighted":
                fmt = "q4_0" if r.format == "q4_lut" else r.format
                fallback = "q4_0" if r.fallback == "q4_lut" else r.fallback
                r = Rule(r.role, fmt, "rtn", fallback, r.group_size if fmt == r.format else None)
            rules.append(r)
        return QuantConfig(scheme=f"{self.scheme}@rtn", rules=rules, neuron_format=self.neuron_format,
                           description=f"round-to-nearest baseline of {self.scheme}")

    # -- serialization ---------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        return {"scheme": self.scheme, "version": self.version, "description": self.description,
                "neuron_format": self.neuron_format, "rules": [dataclasses.asdict(r) for r in self.rules]}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> QuantConfig:
        if not isinstance(d, dict) or not isinstance(d.get("rules"), list) or "scheme" not in d:
            raise QuantConfigError("a quant config needs 'scheme' and a list of 'rules'")
        names = {f.name for f in dataclasses.fields(Rule)}
        rules = []
        for i, r in enumerate(d["rules"]):
            if not isinstance(r, dict) or "role" not in r or "format" not in r:
                raise QuantConfigError(f"quant config rules[{i}] needs 'role' and 'format'")
            rules.append(Rule(**{k: v for k, v in r.items() if k in names}))
        return cls(scheme=str(d["scheme"]), rules=rules, version=int(d.get("version", CONFIG_VERSION)),
                   neuron_format=d.get("neuron_format"), description=str(d.get("description", "")))

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    @classmethod
    def from_json(cls, text: str) -> QuantConfig:
        try:
            return cls.from_dict(json.loads(text))
        except ValueError as e:
            if isinstance(e, QuantConfigError):
                raise
            raise QuantConfigError(f"quant config is not valid JSON ({e})") from None

    def with_group_size(self, group_size: int | None) -> QuantConfig:
        """This config with a group size required of every quantized rule (validated per format)."""
        if group_size is None:
            return self
        rules = [dataclasses.replace(r, group_size=group_size) if r.format not in ("keep", "f32", "f16") else r
                 for r in self.rules]
        return dataclasses.replace(self, rules=rules)

