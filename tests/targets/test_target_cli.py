"""Bad input to `edgeflash export --target ...` and `ef.export(..., target=...)`: one line naming
what is wrong, exit status 2, no traceback, and nothing left at the output path."""

from __future__ import annotations

import resource
import subprocess
import sys
import textwrap

import pytest


def run(args: list[str], capsys) -> tuple[int, str]:
    """`edgeflash export ARGS` in this process: (exit status, stderr)."""
    from edgeflash.cli.main import main

    capsys.readouterr()
    status = main(["export", *args])
    return status, capsys.readouterr().err


def assert_one_line_error(status: int, stderr: str, *fragments: str) -> None:
    lines = stderr.strip().splitlines()
    assert status == 2 and len(lines) == 1 and lines[0].startswith("edgeflash: error: "), stderr[-2000:]
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


@pytest.mark.parametrize("args,fragments", [
    (["--target", "tensorrt"], ["target 'tensorrt' is not available", "executorch, onnx, coreml"]),
    (["--target", "onnx", "--quant", "q4_1"], ["target onnx", "would be q4_1", "cannot hold"]),
    (["--target", "executorch", "--quant", "q4_k"], ["target executorch", "cannot hold"]),
    (["--target", "executorch", "--quant", "keep"], ["would be q4_1 (kept from the source)"]),  # SmolLM2's GGUF is Q4_1
    (["--target", "onnx", "--kv", "state"], ["target onnx: kv = 'state' is not available"]),
    (["--target", "onnx", "--chunks", "31"], ["chunks = 31", "only 30 layers"]),
    (["--target", "onnx", "--cache-len", "100000"], ["cache_len = 100000", "context"]),
    (["--target", "coreml", "--eval-tokens", "16"], ["--eval-tokens", "only for the bundle target"]),
    (["--chunks", "2"], ["--chunks", "not bundle"]),
    (["--target", "onnx", "--et-activations", "f32"], ["--et-activations: only for --target executorch, not onnx"]),
    (["--et-activations", "f32"], ["--et-activations: only for --target executorch, not bundle"]),
])
def test_bad_target_options(tmp_path, smollm_path, capsys, args, fragments):
    out = tmp_path / "out"
    assert_one_line_error(*run([str(smollm_path), "-o", str(out), "--quiet", *args], capsys), *fragments)
    assert list(tmp_path.iterdir()) == []


def test_unknown_family(tmp_path, smollm_path, capsys):
    """A model whose architecture no export graph (nor the runtime) knows."""
    p = tmp_path / "odd.gguf"
    data = bytearray(smollm_path.read_bytes())
    at = data.index(b"general.architecture") + len(b"general.architecture")
    end = data.index(b"llama", at)
    data[end:end + 5] = b"zzzzz"
    p.write_bytes(bytes(data))
    out = tmp_path / "out"
    assert_one_line_error(*run([str(p), "-o", str(out), "--target", "onnx", "--quiet"], capsys),
                          "architecture 'zzzzz' is not supported")
    assert not out.exists()


@pytest.mark.parametrize("target,package", [("coreml", "coremltools"), ("executorch", "executorch"),
                                            ("onnx", "onnxruntime")])
def test_missing_package(tmp_path, smollm_path, capsys, monkeypatch, target, package):
    # None in sys.modules is Python's own marker for "this module cannot be imported".
    monkeypatch.setitem(sys.modules, package, None)
    result = run([str(smollm_path), "-o", str(tmp_path / "out"), "--target", target, "--quiet"], capsys)
    assert_one_line_error(*result, f"target {target} needs the Python package(s) {package}",
                          "pip install 'edgeflash[backends]'")
    assert list(tmp_path.iterdir()) == []


def test_write_error_leaves_nothing(tmp_path):
    """A file size limit hit while a chunk file is written (as when the disk fills up): one line,
    and neither the export nor its temporary directory is left."""
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (8 << 20, 8 << 20))

    out = tmp_path / "export"
    code = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(__import__("pathlib").Path(__file__).parent)!r})
        from target_checks import first_layers
        import edgeflash as ef
        from edgeflash.base.errors import UserError
        from edgeflash.export.sources import load_source
        try:
            ef.export(first_layers(load_source("smollm2-135m"), 1), {str(out)!r}, quant="q4_0-rtn", target="onnx",
                      cache_len=32, prefill_tokens=8, calibration_tokens=0, progress=False)
        except UserError as e:
            print(e, file=sys.stderr)
            sys.exit(2)
        """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600,
                          preexec_fn=limit, check=False)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "writing chunk 0 failed (File too large)" in proc.stderr and "nothing was left behind" in proc.stderr, proc.stderr[-2000:]
    assert list(tmp_path.iterdir()) == []
