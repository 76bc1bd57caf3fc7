"""Threads and instruction-set selection for every kernel."""

from __future__ import annotations

from . import _native


def set_num_threads(n: int) -> None:
    """Size of the persistent thread pool shared by all kernels (the caller counts as one)."""
    if isinstance(n, bool) or not isinstance(n, int):
        raise TypeError(f"threads must be an int, got {type(n).__name__}")
    if not 1 <= n <= 1024:
        raise ValueError(f"threads must be between 1 and 1024, got {n}")
    _native.set_num_threads(n)


def get_num_threads() -> int:
    return _native.get_num_threads()


def cpu_features() -> dict:
    """{'arch': 'x86_64' | 'aarch64' | 'other', 'flags': [...]} as detected at run time."""
    return _native.cpu_features()


def available_isas() -> list[str]:
    """Instruction-set levels this CPU supports, lowest first; 'ref' is the scalar reference."""
    return _native.available_isas()


def use_isa(name: str) -> None:
    """Select a level for every kernel: 'auto' (the best), 'ref' (scalar twins, for tests), ..."""
    if not isinstance(name, str):
        raise TypeError(f"isa must be a str, got {type(name).__name__}")
    levels = available_isas()
    if name != "auto" and name not in levels:
        raise ValueError(f"instruction set {name!r} is not available here; choose auto or one of {', '.join(levels)}")
    _native.use_isa(name)


def current_isa() -> str:
    return _native.current_isa()


def implementations() -> dict[str, str]:
    """Kernel name -> the level whose implementation runs it now (e.g. 'gemm_q8_q4_0': 'avx512')."""
    return dict(_native.implementations())
