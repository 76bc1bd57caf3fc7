"""llama.cpp's quantization names (`llama-quantize` types), read as edgeflash schemes where they map.

A user who types `--quant Q4_K_M` gets the edgeflash scheme closest to what llama.cpp would make;
a name with no edgeflash counterpart (formats the kernels do not have, like 5-bit K-quants or the
i-quants) is refused with the list of names that do map.
"""

from __future__ import annotations

# llama.cpp name (lower case) -> edgeflash scheme, and why where it is not the same format.
LLAMA_CPP_SCHEMES: dict[str, tuple[str, str]] = {
    "f32": ("mixed:*=f32", ""),
    "f16": ("f16", ""),
    "q8_0": ("q8_0", ""),
    "q4_0": ("q4_0", "calibrated scales (same format)"),
    "q4_1": ("q4_1", "calibrated scales (same format)"),
    "q5_0": ("q5_0", "calibrated scales (same format)"),
    "q4_k_m": ("q4_k", ("every matrix q4_k (llama.cpp keeps some in q6_k); rows that are not a multiple of 256 "
                        "and the FFN's neuron arena use q5_0")),
    "q4_k_s": ("q4_k", ("every matrix q4_k; rows that are not a multiple of 256 and the FFN's neuron arena use "
                        "q5_0")),
    "q4_k": ("q4_k", ""),
    "q3_k_s": ("q3_k", "every matrix q3_k; rows that are not a multiple of 256 use q4_0"),
    "q3_k_m": ("q3_k", ("every matrix q3_k (llama.cpp keeps some in q4_k to q6_k); rows that are not a multiple "
                        "of 256 use q4_0")),
    "q3_k": ("q3_k", ""),
}
UNMAPPED = ("bf16", "q2_k", "q3_k_l", "q5_1", "q5_k_s", "q5_k_m", "q6_k", "iq1_s", "iq2_xxs",
            "iq2_xs", "iq3_xxs", "iq3_s", "iq4_nl", "iq4_xs", "tq1_0", "tq2_0")


def llama_cpp_scheme(name: str) -> str | None:
    """The edgeflash scheme for a llama.cpp quantization name (any case), or None if it is not one."""
    entry = LLAMA_CPP_SCHEMES.get(name.lower())
    return entry[0] if entry else None


def unmapped_message(name: str) -> str | None:
    """The refusal for a llama.cpp name edgeflash cannot make, or None if `name` is not one."""
    if name.lower() not in UNMAPPED:
        return None
    return (f"--quant {name}: llama.cpp's {name.upper()} has no edgeflash format; llama.cpp names that map: "
            f"{', '.join(n.upper() for n in LLAMA_CPP_SCHEMES)} (or an edgeflash scheme)")
