"""Consistency of the iOS sample's Swift sources (apps/ios) with what the exporter writes.

No Swift compiler exists here, so nothing is compiled or run. These checks parse every Swift file
with tree-sitter's Swift grammar (syntax only, see swift_syntax.py), and read the Swift text to
compare the names it relies on with a Core ML export's manifest.json and tokenizer.json as the
exporter's own code writes them (SmolLM2 with kv=io, Gemma 3 with kv=state).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from target_exports import write_export

IOS = Path(__file__).resolve().parents[2] / "apps" / "ios"
LLM = IOS / "Sources" / "EdgeflashLLM"

# Swift struct -> where its object sits in manifest.json ("*" = every element of a list).
STRUCT_PATHS = {
    "Manifest": [], "ModelInfo": ["model"], "SpecInfo": ["model", "spec"], "TokenizerInfo": ["tokenizer"],
    "CacheInfo": ["cache"], "MethodInfo": ["methods", "*"], "ChunkEntry": ["chunks", "*"],
    "TensorEntry": ["chunks", "*", "inputs", "*"],
}


def coding_keys(source: str) -> dict[str, set[str]]:
    """JSON keys of each Decodable struct: the raw values of its CodingKeys enum."""
    out: dict[str, set[str]] = {}
    for match in re.finditer(r"public struct (\w+): Decodable \{(.*?)\n\}", source, re.DOTALL):
        name, body = match.groups()
        enum = re.search(r"enum CodingKeys: String, CodingKey \{(.*?)\}", body, re.DOTALL)
        assert enum, f"struct {name} has no CodingKeys (every key is spelled out so this test can read it)"
        cases = re.findall(r"(\w+) = \"([^\"]+)\"", enum.group(1))
        assert cases, name
        out[name] = {key for _, key in cases}
    return out


def objects_at(node, path: list[str]) -> list:
    if not path:
        return [node]
    head, rest = path[0], path[1:]
    if head == "*":
        items = node.values() if isinstance(node, dict) else node
        return [o for item in items for o in objects_at(item, rest)]
    return objects_at(node[head], rest)


@pytest.fixture(scope="module")
def exports(tmp_path_factory, smollm_path, gemma_path):
    from edgeflash.export.sources import load_source

    root = tmp_path_factory.mktemp("ios")
    return [write_export(root / "smol-cm", load_source(str(smollm_path)), "coreml", "io", 3, 64, 16),
            write_export(root / "gemma-cm", load_source(str(gemma_path)), "coreml", "state", 2, 64, 16)]


def test_manifest_keys_exist_in_the_exported_manifest(exports):
    keys = coding_keys((LLM / "Manifest.swift").read_text())
    assert set(keys) == set(STRUCT_PATHS), "a Decodable struct without a known place in the manifest"
    for folder in exports:
        manifest = json.loads((folder / "manifest.json").read_text())
        for struct, path in STRUCT_PATHS.items():
            for obj in objects_at(manifest, path):
                missing = keys[struct] - set(obj)
                assert not missing, f"{struct} reads {sorted(missing)}, absent from {'.'.join(path) or 'the root'}"


def test_feature_names_match_the_chunk_io(exports):
    """The names ChunkedLLM.swift passes to and reads from Core ML are the manifest's."""
    swift = (LLM / "ChunkedLLM.swift").read_text()
    literal = set(re.findall(r"\"([a-z_]+)(?:\.\\\(layer\))?\"", swift))
    for name in ("input_pos", "last", "k_cache", "v_cache"):
        assert name in literal, name
    assert '"\\(kind)_new.\\(layer)"' in swift and '["k", "v"]' in swift
    for folder in exports:
        manifest = json.loads((folder / "manifest.json").read_text())
        for chunk in manifest["chunks"]:
            inputs = [i["name"] for i in chunk["inputs"]]
            outputs = [o["name"] for o in chunk["outputs"]]
            assert inputs[0] in ("tokens", "hidden") and inputs[1] == "input_pos"
            assert ("last" in inputs) == chunk["head"]
            assert outputs[0] == ("logits" if chunk["head"] else "hidden")
            layers = range(*chunk["layers"])
            cache_inputs = {f"{k}_cache.{layer}" for layer in layers for k in "kv"}
            cache_outputs = {f"{k}_new.{layer}" for layer in layers for k in "kv"}
            io = manifest["cache"]["mode"] == "io"
            assert (cache_inputs <= set(inputs)) == io and (cache_outputs <= set(outputs)) == io
        assert set(manifest["methods"]) == {"prefill", "decode"}  # the function names CoreMLChunk loads


def test_tokenizer_keys_and_steps_exist_in_the_exported_tokenizers(exports):
    swift = (LLM / "Tokenizer" / "Tokenizer.swift").read_text()
    steps = (LLM / "Tokenizer" / "Steps.swift").read_text()

    def enum_values(name: str) -> set[str]:
        body = re.search(rf"enum {name} \{{(.*?)\n\}}", swift, re.DOTALL).group(1)
        return set(re.findall(r"= \"([a-z_]+)\"", body))

    spec_keys, model_keys = enum_values("SpecKeys"), enum_values("ModelKeys")
    assert {"model", "added_tokens", "prefix_ids", "end_ids"} <= spec_keys and "vocab" in model_keys
    supported = set(re.findall(r"case \"(\w+)\"", steps))
    for folder in exports:
        tok = json.loads((folder / "tokenizer.json").read_text())
        assert spec_keys <= set(tok), spec_keys - set(tok)
        assert model_keys <= set(tok["model"]), model_keys - set(tok["model"])
        assert tok["model"]["merge_order"] in ("merges", "token_order", "scores")
        for field in ("normalizer", "pre_tokenizer", "decoder"):
            used = set(re.findall(r"'type': '(\w+)'", repr(tok[field])))
            assert used <= supported, f"{folder.name} {field} uses {used - supported}, which Steps.swift lacks"


SWIFT_SOURCES = sorted(IOS.rglob("*.swift"))


@pytest.fixture(scope="module")
def swift_parser():
    from swift_syntax import parser

    return parser()


@pytest.mark.parametrize("source", SWIFT_SOURCES, ids=lambda p: str(p.relative_to(IOS)))
def test_swift_source_parses(swift_parser, source):
    """Syntax only (tree-sitter's Swift grammar): no Swift compiler exists here, see apps/ios/README.md."""
    from swift_syntax import syntax_errors

    assert syntax_errors(swift_parser, source.read_bytes()) == []


def test_swift_syntax_check_finds_errors(swift_parser):
    """The check above can fail: the same sources with one closing brace or parenthesis lost do not parse."""
    from swift_syntax import syntax_errors

    assert len(SWIFT_SOURCES) >= 14  # the package manifest and every source of both targets
    for source in SWIFT_SOURCES[:6]:
        text = source.read_text(encoding="utf-8")
        for closer in ("}", ")"):
            cut = text.rfind(closer, 0, len(text) // 2) if closer == ")" else text.rfind(closer)
            if cut < 0:
                continue
            broken = (text[:cut] + text[cut + 1:]).encode()
            assert syntax_errors(swift_parser, broken), f"{source.name} without the {closer} at {cut} still parses"


def test_package_targets_the_os_the_exporter_writes_for():
    """Package.swift's iOS version is the Core ML exporter's deployment target, and its tools
    version knows that platform version (PackageDescription 6.0 brought .iOS(.v18), .macOS(.v15))."""
    exporter = (IOS.parents[1] / "export" / "targets" / "coreml.py").read_text(encoding="utf-8")
    targets = set(re.findall(r"minimum_deployment_target=ct\.target\.iOS(\d+)", exporter))
    assert len(targets) == 1, targets
    ios = int(targets.pop())
    package = (IOS / "Package.swift").read_text(encoding="utf-8")
    assert f".iOS(.v{ios})" in package and f".macOS(.v{ios - 3})" in package
    tools = re.match(r"// swift-tools-version:\s*(\d+)\.(\d+)", package)
    assert tools and (int(tools[1]), int(tools[2])) >= ((6, 0) if ios >= 18 else (5, 9)), tools
