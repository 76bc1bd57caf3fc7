"""Quantization API shared by every exporter (bundle, and ExecuTorch / ONNX / Core ML writers).

    from edgeflash.export.quant import QuantConfig, Rule, get_scheme, role_of, quantize_matrix
    cfg = get_scheme("q4_0-mixed")                 # or "mixed:attention=q8_0,ffn=q4_0"
    cfg.plan("blk.0.ffn_up.weight", (2048, 640))   # -> TensorPlan(format, method, fallback...)
    QuantConfig.from_json(cfg.to_json()) == cfg
    packed = quantize_matrix(w_f32, "q4_0", "weighted", importance=e_x2)

A config is data (ordered per-role rules + neuron arena format, versioned); schemes are named
configs in a registry; `quantize_matrix` turns float rows into a format's packed bytes.
"""

from edgeflash.export.quant.config import (
    ARENA_FORMATS,
    CONFIG_VERSION,
    METHODS,
    RULE_FORMATS,
    QuantConfig,
    QuantConfigError,
    Rule,
    TensorPlan,
    default_method,
)
from edgeflash.export.quant.methods import dequantize_matrix, prepare_importance, quantize_matrix
from edgeflash.export.quant.roles import ROLES, role_of
from edgeflash.export.quant.schemes import (
    get_scheme,
    list_schemes,
    parse_mixed,
    register_scheme,
    resolve_config,
)

__all__ = [
    "ARENA_FORMATS", "CONFIG_VERSION", "METHODS", "ROLES", "RULE_FORMATS", "QuantConfig", "QuantConfigError", "Rule",
    "TensorPlan", "default_method", "dequantize_matrix", "get_scheme", "list_schemes", "parse_mixed",
    "prepare_importance", "quantize_matrix", "register_scheme", "resolve_config", "role_of",
]
