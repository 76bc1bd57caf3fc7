"""Builds the C++ kernel test binary natively and cross-compiled for aarch64, and runs both
(the aarch64 one under qemu). Each binary runs every kernel at every SIMD level the (emulated)
CPU offers against the scalar reference and fails if any kernel still runs the reference."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import edgeflash.kernels as K
import pytest

ROOT = Path(__file__).resolve().parents[2]
TOOLCHAIN = ROOT / "kernels/cmake/aarch64-linux-gnu.cmake"
QEMU_SYSROOT = "/usr/aarch64-linux-gnu"


def _tool(name: str) -> str:
    local = Path(sys.executable).parent / name  # the venv's cmake / ninja first
    found = str(local) if local.exists() else shutil.which(name)
    assert found, f"{name} not found (make install provides it)"
    return found


def _build(build_dir: Path, *extra: str) -> Path:
    cmake = _tool("cmake")
    has_ninja = shutil.which("ninja") or (Path(sys.executable).parent / "ninja").exists()
    gen = ["-G", "Ninja", f"-DCMAKE_MAKE_PROGRAM={_tool('ninja')}"] if has_ninja else []
    subprocess.run([cmake, "-S", str(ROOT), "-B", str(build_dir), *gen, "-DCMAKE_BUILD_TYPE=Release",
                    "-DEF_BUILD_PYTHON=OFF", "-DEF_BUILD_TESTS=ON", *extra], check=True, capture_output=True, text=True)
    jobs = str(os.cpu_count() or 2)
    res = subprocess.run([cmake, "--build", str(build_dir), "--target", "ef_kernel_tests", "-j", jobs],
                         capture_output=True, text=True)
    assert res.returncode == 0, f"build failed:\n{res.stdout[-4000:]}\n{res.stderr[-4000:]}"
    exe = build_dir / "tests/kernels/ef_kernel_tests"
    assert exe.exists()
    return exe


def _check(output: str, levels: list[str]) -> None:
    assert re.search(r"\d+ checks, 0 failures", output), output[-4000:]
    for level in levels:
        assert f"level {level}" in output, f"level {level} did not run:\n{output}"
        line = next(ln for ln in output.splitlines() if ln.startswith(f"implementations exercised at level {level}:"))
        impls = dict(item.split("=") for item in line.split(":", 1)[1].split())
        assert impls and "ref" not in impls.values(), line
        # the quantized GEMM of this level is its own code, not inherited from a lower level
        # (the i8mm level adds only the panel GEMM: smmla pays for pairs of tokens)
        own = "gemm_q8_panels_q4_0" if level == "neon_i8mm" else "gemm_q8_q4_0"
        assert impls[own] == level, line


def _check_no_shared_inline_code(build_dir: Path, nm: str) -> None:
    """SIMD objects must not export weak (COMDAT) symbols: the linker could otherwise pick an
    AVX-512 or dotprod copy of an inline function for code that runs on a CPU without it."""
    objs = sorted((build_dir / "kernels/CMakeFiles/ef_kernels.dir").glob("*/*_*.cpp.o"))
    simd = [o for o in objs if o.parent.name in ("x86", "arm")]
    assert simd, f"no SIMD objects found under {build_dir}"
    for o in simd:
        out = subprocess.run([nm, "-C", str(o)], capture_output=True, text=True, check=True).stdout
        weak = [ln for ln in out.splitlines() if re.search(r" [WVu] ", ln)]
        assert not weak, f"{o.name} exports weak symbols: {weak[:5]}"


def test_cpp_suite_native():
    exe = _build(ROOT / "build/kernels-tests/native")
    _check_no_shared_inline_code(ROOT / "build/kernels-tests/native", shutil.which("nm") or "nm")
    levels = [lvl for lvl in K.available_isas() if lvl != "ref"]
    assert levels, "this CPU has no SIMD level the kernels support"
    args = [a for lvl in levels for a in ("--expect-isa", lvl)]
    res = subprocess.run([str(exe), *args], capture_output=True, text=True, timeout=600)
    print(res.stdout)
    assert res.returncode == 0, res.stdout[-6000:] + res.stderr[-2000:]
    _check(res.stdout, levels)


def test_cpp_suite_aarch64_under_qemu():
    # Installed by `make system-deps` (part of `make test`); missing tools are a failure, not a skip.
    assert shutil.which("aarch64-linux-gnu-g++"), "aarch64-linux-gnu-g++ missing: run `make system-deps`"
    qemu = shutil.which("qemu-aarch64-static") or shutil.which("qemu-aarch64")
    assert qemu, "qemu-aarch64-static missing: run `make system-deps`"
    exe = _build(ROOT / "build/kernels-tests/aarch64", f"-DCMAKE_TOOLCHAIN_FILE={TOOLCHAIN}")
    _check_no_shared_inline_code(ROOT / "build/kernels-tests/aarch64", shutil.which("aarch64-linux-gnu-nm") or "nm")
    levels = ["neon", "neon_dotprod", "neon_i8mm"]
    args = [a for lvl in levels for a in ("--expect-isa", lvl)]
    res = subprocess.run([qemu, "-L", QEMU_SYSROOT, str(exe), *args], capture_output=True, text=True, timeout=900)
    print(res.stdout)
    assert res.returncode == 0, res.stdout[-6000:] + res.stderr[-2000:]
    assert "arch aarch64" in res.stdout
    _check(res.stdout, levels)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q", "-s"]))
