"""The package's dependencies point one way: base <- kernels <- memory <- runtime <- export <- sdk
(the public API, CLI and server in the root package `edgeflash`). A layer never imports one above
it, in Python or in C++, and no modules import each other in a cycle.

The scan reads source files (AST for Python, `#include` lines for C++); nothing is imported.
`check_python` and `check_cpp` return the offending edges so that a test can also show that a
reintroduced upward import is caught.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Bottom first. The folder of each layer and the import name it installs as.
LAYERS = [("base", "edgeflash.base"), ("kernels", "edgeflash.kernels"), ("memory", "edgeflash.memory"),
          ("runtime", "edgeflash.runtime"), ("export", "edgeflash.export"), ("sdk", "edgeflash")]
RANK = {name: i for i, (_, name) in enumerate(LAYERS)}
CPP_LAYERS = [("kernels", 1), ("memory/native", 2), ("runtime/native", 3)]


def layer_of_module(module: str) -> str | None:
    """The layer an import name belongs to (`edgeflash` itself and anything not in a lower layer is sdk)."""
    if module != "edgeflash" and not module.startswith("edgeflash."):
        return None
    for _, name in LAYERS[:-1]:
        if module == name or module.startswith(name + "."):
            return name
    return "edgeflash"


def module_name(path: Path) -> str:
    for folder, name in LAYERS:
        base = ROOT / folder
        if base in path.parents:
            parts = list(path.relative_to(base).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            return ".".join([name, *parts])
    raise ValueError(path)


def python_files(root: Path = ROOT) -> list[Path]:
    return [p for folder, _ in LAYERS for p in sorted((root / folder).rglob("*.py"))]


def imports_of(path: Path, source: str | None = None) -> list[tuple[str, int, bool]]:
    """Every edgeflash module `path` imports, anywhere in the file (function-level imports too),
    with its line number and whether it runs (False under `if TYPE_CHECKING:`).
    `from edgeflash.x import y` counts as edgeflash.x.y when y is a module."""
    tree = ast.parse(source if source is not None else path.read_text(), filename=str(path))
    own = module_name(path)
    package = own if path.name == "__init__.py" else own.rpartition(".")[0]
    typing_only = {id(n) for block in ast.walk(tree) if isinstance(block, ast.If) and _is_type_checking(block.test)
                   for stmt in block.body for n in ast.walk(stmt)}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(a.name, node.lineno, node) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for alias in node.names:
                candidate = f"{target}.{alias.name}"
                is_module = layer_of_module(candidate) is not None and _is_module(candidate)
                found.append((candidate if is_module else target, node.lineno, node))
    return [(m, line, id(node) not in typing_only) for m, line, node in found if layer_of_module(m) is not None]


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _is_module(name: str) -> bool:
    layer = layer_of_module(name)
    folder = next(f for f, n in LAYERS if n == layer)
    rest = name[len(layer):].lstrip(".").split(".") if name != layer else []
    base = ROOT / folder / Path(*rest) if rest else ROOT / folder
    compiled = bool(rest) and any(base.parent.glob(base.name + ".*.so")) or rest == ["_native"]
    return base.with_suffix(".py").exists() or (base / "__init__.py").exists() or compiled


def check_python(overrides: dict[Path, str] | None = None) -> list[str]:
    """Upward imports and module cycles, as readable lines (empty when the layering holds).
    `overrides` replaces a file's text (to show that an edit would be caught)."""
    overrides = overrides or {}
    problems, graph = [], {}
    for path in python_files():
        own = module_name(path)
        edges = imports_of(path, overrides.get(path))
        graph[own] = {m for m, _, runs in edges if m != own and runs}
        for target, line, _ in edges:
            if RANK[layer_of_module(target)] > RANK[layer_of_module(own)]:
                problems.append(f"{path.relative_to(ROOT)}:{line}: {own} imports {target}, a layer above it")
    problems += [f"import cycle: {' -> '.join(c)}" for c in _cycles(graph)]
    return problems


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle per strongly connected component of more than one module (Tarjan)."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in graph:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def cpp_files() -> list[Path]:
    return [p for folder, _ in CPP_LAYERS for p in sorted((ROOT / folder).rglob("*"))
            if p.suffix in (".h", ".cpp")]


def cpp_rank(path: Path) -> int:
    rel = path.relative_to(ROOT).as_posix()
    return max(rank for folder, rank in CPP_LAYERS if rel.startswith(folder + "/"))


def check_cpp(overrides: dict[Path, str] | None = None) -> list[str]:
    """#include lines that reach a header of a layer above the including file."""
    overrides = overrides or {}
    headers: dict[str, list[Path]] = {}
    for p in cpp_files():
        if p.suffix == ".h":
            headers.setdefault(p.name, []).append(p)
    problems = []
    for path in cpp_files():
        text = overrides.get(path, path.read_text())
        for m in _INCLUDE.finditer(text):
            name = Path(m.group(1)).name
            for header in headers.get(name, []):
                if m.group(1).count("/") and not header.as_posix().endswith(m.group(1)):
                    continue
                if cpp_rank(header) > cpp_rank(path):
                    line = text[:m.start()].count("\n") + 1
                    problems.append(f"{path.relative_to(ROOT)}:{line}: includes {header.relative_to(ROOT)}, "
                                    "a layer above it")
    return problems


def test_python_imports_point_down_without_cycles():
    assert check_python() == []


def test_cpp_includes_point_down():
    assert check_cpp() == []


def test_an_upward_import_is_caught():
    target = ROOT / "memory" / "planner.py"
    edited = target.read_text() + "\nfrom edgeflash.runtime.spec import ModelSpec  # noqa\n"
    problems = check_python({target: edited})
    assert any("edgeflash.memory.planner imports edgeflash.runtime.spec" in p for p in problems), problems


def test_an_upward_include_is_caught():
    target = next(p for p in cpp_files() if p.relative_to(ROOT).as_posix().startswith("kernels/src/"))
    problems = check_cpp({target: target.read_text() + '\n#include "engine.h"\n'})
    assert any("includes runtime/native/engine.h" in p for p in problems), problems


def test_a_module_cycle_is_caught():
    graph = {"edgeflash.memory.a": {"edgeflash.memory.b"}, "edgeflash.memory.b": {"edgeflash.memory.a"}}
    assert _cycles(graph) == [["edgeflash.memory.a", "edgeflash.memory.b"]]


def test_the_runtime_imports_no_api_cli_or_server():
    """A device imports edgeflash.runtime; the public API, CLI and server stay unloaded (importing a
    subpackage runs edgeflash/__init__.py, which must stay lazy)."""
    import subprocess
    import sys

    code = ("import sys, edgeflash.runtime.loader, edgeflash.runtime.generate; "
            "print('\\n'.join(m for m in sys.modules if m.startswith('edgeflash')))")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert "edgeflash.runtime.loader" in loaded
    above = [m for m in loaded if layer_of_module(m) in ("edgeflash", "edgeflash.export") and m != "edgeflash"]
    assert above == [], above
