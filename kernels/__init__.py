"""edgeflash.kernels: hand-written CPU kernels (C++, chosen at run time by CPU features).

Every function validates its arguments (dtype, shape, contiguity, alignment, sizes) and raises
TypeError or ValueError with one clear sentence; the C++ layer checks again so a bad call cannot
corrupt memory. See docs/kernels.md and docs/weight-formats.md.
"""

from ._native import __version__
from .attention import KIVI, attention, kivi_recent, kv_read, kv_write, new_kv_cache
from .elementwise import argmax, gated_act, rms_norm, rope, softmax, topk
from .ffn import ffn_sparse, pack_bundles
from .formats import (
                      FORMATS,
                      KERNEL_FORMATS,
                      KV_FORMATS,
                      QUANTIZABLE,
                      bundle_bytes,
                      format_info,
                      kv_cache_bytes,
                      kv_capacity,
                      kv_key_bytes,
                      kv_row_bytes,
                      row_bytes,
)
from .linear import (PANEL_FORMATS, dequantize, matmul, matmul_columns, matmul_panels, matmul_rows, pack_panels,
                     quantize, quantize_q4_lut)
from .runtime import (
                      available_isas,
                      cpu_features,
                      current_isa,
                      get_num_threads,
                      implementations,
                      set_num_threads,
                      use_isa,
)

__all__ = [
    "__version__", "FORMATS", "KERNEL_FORMATS", "KV_FORMATS", "QUANTIZABLE",
    "row_bytes", "bundle_bytes", "kv_row_bytes", "kv_cache_bytes", "kv_key_bytes", "kv_capacity", "format_info",
    "matmul", "matmul_rows", "matmul_columns", "dequantize", "quantize", "quantize_q4_lut", "pack_panels",
    "matmul_panels", "PANEL_FORMATS",
    "ffn_sparse", "pack_bundles",
    "attention", "kv_write", "kv_read", "new_kv_cache", "KIVI",
    "rms_norm", "rope", "gated_act", "softmax", "argmax", "topk",
    "set_num_threads", "get_num_threads", "cpu_features", "available_isas", "use_isa", "current_isa",
    "implementations",
]
