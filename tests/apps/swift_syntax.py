"""A syntax check of Swift sources with the tree-sitter Swift grammar (PyPI `tree-sitter-swift`).

No Swift compiler is installable here (none in Debian 12, PyPI or npm), so this is the check
that runs: the grammar parses each file and every ERROR or MISSING node it had to insert is a
syntax error. It knows nothing of types, names or imports: code that parses can still fail to
compile. A grammar can also reject valid code; every file of the sample parses today, so a new
rejection points at the last edit (read the reported line against the Swift grammar). The two
wheels are installed into a cache directory on first use, as kotlinc is.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

PACKAGES = ("tree-sitter==0.26.1", "tree-sitter-swift==0.7.4")
CACHE = Path(os.environ.get("EDGEFLASH_CACHE", Path.home() / ".cache" / "edgeflash")) / "tree-sitter"


def parser():
    """A tree_sitter.Parser for Swift."""
    target = CACHE / f"{'-'.join(p.replace('==', '-') for p in PACKAGES)}-py{sys.version_info[0]}{sys.version_info[1]}"
    if not (target / "tree_sitter_swift").exists():
        tmp = target.with_name(f"{target.name}.tmp{os.getpid()}")
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-deps",
                        "--target", str(tmp), *PACKAGES], check=True, timeout=600)
        try:
            tmp.replace(target)
        except OSError:  # another test process installed it first (or a broken copy is in the way)
            shutil.rmtree(tmp, ignore_errors=True)
            if not (target / "tree_sitter_swift").exists():
                raise
    if str(target) not in sys.path:
        sys.path.insert(0, str(target))
    import tree_sitter
    import tree_sitter_swift

    return tree_sitter.Parser(tree_sitter.Language(tree_sitter_swift.language()))


def syntax_errors(parse, source: bytes) -> list[str]:
    """`line:column: what` for each place the grammar could not parse (empty when it all parses)."""
    errors: list[str] = []
    stack = [parse.parse(source).root_node]
    while stack:
        node = stack.pop()
        if node.is_error or node.is_missing:
            row, column = node.start_point
            text = source[node.start_byte:node.end_byte].decode(errors="replace").splitlines()
            what = f"missing {node.type}" if node.is_missing else f"cannot parse {(text[0] if text else '')[:60]!r}"
            errors.append(f"{row + 1}:{column + 1}: {what}")
        elif node.has_error:
            stack.extend(node.children)
    return sorted(errors)
