"""The `edgeflash` command as a user runs it: bad input is one line and exit 2, --json stats."""

from __future__ import annotations

import json
import subprocess
import sys


def run_cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "edgeflash.cli.main", *args], capture_output=True, text=True,
                          timeout=timeout)


def assert_one_line_error(proc: subprocess.CompletedProcess, *fragments: str) -> None:
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


def test_missing_file(tmp_path):
    assert_one_line_error(run_cli("generate", "-m", str(tmp_path / "nope.gguf"), "-p", "hi"), "nope.gguf",
                          "no such file")


def test_not_a_gguf(tmp_path):
    p = tmp_path / "model.gguf"
    p.write_bytes(b"PK\x03\x04 this is a zip, not a model")
    assert_one_line_error(run_cli("generate", "-m", str(p), "-p", "hi"), "model.gguf", "not a model file")


def test_truncated_gguf(tmp_path, smollm_path):
    p = tmp_path / "cut.gguf"
    p.write_bytes(smollm_path.read_bytes()[:20_000_000])
    assert_one_line_error(run_cli("generate", "-m", str(p), "-p", "hi"), "cut.gguf", "truncated")


def _rewrite_metadata_string(src, dst, key: bytes, old: bytes, new: bytes) -> None:
    """Replace a same-length string value right after `key` in a GGUF header."""
    data = bytearray(src.read_bytes())
    at = data.index(key) + len(key)
    end = data.index(old, at)
    assert end - at < 16, "value not right after the key"
    data[end:end + len(old)] = new
    dst.write_bytes(bytes(data))


def test_unsupported_architecture(tmp_path, smollm_path):
    p = tmp_path / "odd.gguf"
    _rewrite_metadata_string(smollm_path, p, b"general.architecture", b"llama", b"zzzzz")
    assert_one_line_error(run_cli("generate", "-m", str(p), "-p", "hi"), "architecture 'zzzzz' is not supported")


def test_unknown_tensor_type(tmp_path, smollm_path):
    data = bytearray(smollm_path.read_bytes())
    name = b"token_embd.weight"
    at = data.index(name) + len(name)
    n_dims = int.from_bytes(data[at:at + 4], "little")
    data[at + 4 + 8 * n_dims: at + 8 + 8 * n_dims] = (77).to_bytes(4, "little")
    p = tmp_path / "type77.gguf"
    p.write_bytes(bytes(data))
    assert_one_line_error(run_cli("generate", "-m", str(p), "-p", "hi"), "unknown GGML tensor type 77")


def test_negative_max_tokens(smollm_path):
    assert_one_line_error(run_cli("generate", "-m", str(smollm_path), "-p", "hi", "-n", "-1"), "-n", "'-1'")


def test_unknown_option():
    assert_one_line_error(run_cli("generate", "-p", "hi", "--bogus"), "--bogus")


def test_generate_json_stats(smollm_path):
    proc = run_cli("generate", "-m", str(smollm_path), "-p", "Once upon a time", "-n", "8", "--json",
                   "--engine", "reference")
    assert proc.returncode == 0, proc.stderr
    stats = json.loads(proc.stdout.strip().splitlines()[-1])
    for key in ("prompt_tokens", "generated_tokens", "prefill_tok_s", "decode_tok_s", "peak_rss_bytes"):
        assert key in stats, key
    assert stats["prompt_tokens"] == 4
    assert stats["generated_tokens"] == 8
    assert stats["decode_tok_s"] > 0 and stats["prefill_tok_s"] > 0
    assert stats["peak_rss_bytes"] > 50_000_000


def test_generate_speculative_reports_acceptance(smol_bundle):
    proc = run_cli("generate", "-m", str(smol_bundle), "-p", "one two three, one two three, one two three,", "-n", "24",
                   "--speculative", "lookup", "--json")
    assert proc.returncode == 0, proc.stderr
    stats = json.loads(proc.stdout.strip().splitlines()[-1])
    assert stats["spec_passes"] > 0 and stats["spec_mean_accepted"] > 1.0  # the prompt repeats itself


def test_bad_speculative_kind(smol_bundle):
    assert_one_line_error(run_cli("generate", "-m", str(smol_bundle), "-p", "hi", "--speculative", "bogus"),
                          "'bogus'", "lookup", "draft:PATH")


def test_help_explains_generate():
    proc = run_cli("generate", "--help")
    assert proc.returncode == 0
    assert "examples:" in proc.stdout and "--memory-budget" in proc.stdout
