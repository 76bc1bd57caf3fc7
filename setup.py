"""Build glue: map the top-level folders onto the single import name `edgeflash` and
build the C++ kernels with CMake (per-file ISA flags need a real build system)."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).parent.resolve()

# import prefix -> folder; every folder below them with an __init__.py is a sub-package.
PACKAGE_ROOTS = {
    "edgeflash": "sdk",
    "edgeflash.base": "base",
    "edgeflash.export": "export",
    "edgeflash.runtime": "runtime",
    "edgeflash.memory": "memory",
    "edgeflash.kernels": "kernels",
}


def discover_packages() -> tuple[list[str], dict[str, str]]:
    packages, package_dir = [], {}
    for prefix, folder in PACKAGE_ROOTS.items():
        for init in sorted((ROOT / folder).rglob("__init__.py")):
            rel = init.parent.relative_to(ROOT / folder)
            name = ".".join([prefix, *rel.parts]) if rel.parts else prefix
            packages.append(name)
            package_dir[name] = str(init.parent.relative_to(ROOT))
    return packages, package_dir


class CMakeExtension(Extension):
    def __init__(self, name: str):
        super().__init__(name, sources=[])


class CMakeBuild(build_ext):
    """Configure once into build/cmake (kept between builds, so rebuilds are incremental)."""

    def build_extension(self, ext: Extension) -> None:
        # CMake always writes the module next to the Python sources in kernels/, so that an
        # editable install and `make native` see the same file; a regular wheel build then
        # copies it to where setuptools expects it.
        out_dir = ROOT / "kernels"
        build_dir = ROOT / "build" / "cmake"
        build_dir.mkdir(parents=True, exist_ok=True)
        generator = ["-G", "Ninja"] if _have("ninja") else []
        subprocess.check_call(
            ["cmake", "-S", str(ROOT), "-B", str(build_dir), *generator,
             "-DCMAKE_BUILD_TYPE=Release", f"-DPython_EXECUTABLE={sys.executable}",
             f"-DEF_PYTHON_OUTPUT_DIR={out_dir}"]
        )
        jobs = str(os.cpu_count() or 2)
        subprocess.check_call(["cmake", "--build", str(build_dir), "--target", "_native", "-j", jobs])
        built = next(out_dir.glob("_native*" + _ext_suffix()))
        target = Path(self.get_ext_fullpath(ext.name)).resolve()
        if built.resolve() != target:
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(built, target)


def _ext_suffix() -> str:
    import sysconfig

    return sysconfig.get_config_var("EXT_SUFFIX")


def _have(tool: str) -> bool:
    return shutil.which(tool) is not None


packages, package_dir = discover_packages()
setup(
    packages=packages,
    package_dir=package_dir,
    package_data={"edgeflash": ["apps/web/*"], "edgeflash.server": ["static/*"]},
    ext_modules=[CMakeExtension("edgeflash.kernels._native")],
    cmdclass={"build_ext": CMakeBuild},
)
