"""The `edgeflash` command as a user runs it: bad input is one line and exit 2, --json stats."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


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
    """--json: stdout is exactly one JSON object (prompt, text, statistics); the text went to stderr."""
    proc = run_cli("generate", "-m", str(smollm_path), "-p", "Once upon a time", "-n", "8", "--json",
                   "--engine", "reference")
    assert proc.returncode == 0, proc.stderr
    assert len(proc.stdout.splitlines()) == 1
    stats = json.loads(proc.stdout)
    assert stats["prompt"] == "Once upon a time" and stats["text"]
    assert ("Once upon a time" + stats["text"]) in proc.stderr
    assert stats["baseline_rss_bytes"] > 10_000_000
    for key in ("prompt_tokens", "generated_tokens", "prefill_tok_s", "decode_tok_s", "peak_rss_bytes"):
        assert key in stats, key
    assert stats["prompt_tokens"] == 4
    assert stats["generated_tokens"] == 8
    assert stats["decode_tok_s"] > 0 and stats["prefill_tok_s"] > 0
    assert stats["peak_rss_bytes"] > 50_000_000


def test_generate_speculative_reports_acceptance(smol_bundle):
    proc = run_cli("generate", "-m", str(smol_bundle), "-p", "one two three, one two three, one two three,", "-n", "24",
                   "--speculative", "lookup", "--json", "--temp", "0", "--repeat-penalty", "1")
    assert proc.returncode == 0, proc.stderr
    stats = json.loads(proc.stdout)
    # The prompt repeats itself, so lookup drafts are confirmed. How many passes run, and so the mean per
    # pass, depends on timing: the guards pause speculation for a while whenever a probe measures it slower.
    assert stats["spec_passes"] > 0 and stats["spec_mean_accepted"] > 0


def test_bad_speculative_kind(smol_bundle):
    assert_one_line_error(run_cli("generate", "-m", str(smol_bundle), "-p", "hi", "--speculative", "bogus"),
                          "'bogus'", "lookup", "draft:PATH")


def test_bad_neuron_chunk(tmp_path):
    assert_one_line_error(run_cli("generate", "-m", str(tmp_path / "any"), "-p", "hi", "--neuron-chunk", "lots"),
                          "--neuron-chunk", "'lots'", "expected a size")


def test_help_explains_generate():
    proc = run_cli("generate", "--help")
    assert proc.returncode == 0
    assert "examples:" in proc.stdout and "--memory-budget" in proc.stdout


def help_sections(command: str) -> dict[str, list[str]]:
    """The options `edgeflash COMMAND --help` lists, by section title."""
    proc = run_cli(command, "--help")
    assert proc.returncode == 0, proc.stderr
    sections: dict[str, list[str]] = {}
    title = None
    for line in proc.stdout.splitlines():
        if line and not line.startswith(" ") and line.endswith(":"):
            title = line[:-1]
            sections[title] = []
        elif title and line.startswith("  -"):
            sections[title].append(line.split()[0].rstrip(","))
    return sections


@pytest.mark.parametrize("command", ["generate", "chat", "serve"])
def test_help_has_two_tiers(command):
    """At most 12 everyday options (help included) come before the advanced group, which holds
    the engine's knobs and the sampling details."""
    sections = help_sections(command)
    titles = list(sections)
    advanced = [t for t in titles if t.startswith("advanced")]
    assert len(advanced) == 1, titles
    everyday = [opt for t in titles[:titles.index(advanced[0])] for opt in sections[t]]
    assert len(everyday) <= 12, everyday
    assert {"-m", "--temp", "--seed", "--memory-budget"} <= set(everyday), everyday
    assert {"--engine", "--strategy", "--kv-cache", "--top-k", "--repeat-penalty", "--frequency-penalty"} <= set(
        sections[advanced[0]]), sections[advanced[0]]


@pytest.mark.parametrize("old, new", [("--window", "--neuron-window"), ("--sparsity", "--ffn-sparsity")])
def test_renamed_options_name_their_new_name(old, new):
    assert_one_line_error(run_cli("generate", "-p", "hi", old, "4"), old, new)


def test_sampling_defaults_and_seeds(smollm_path):
    """The command line samples by default; a seed repeats a run; --temp 0 is greedy like the API."""
    import edgeflash as ef

    base = ["generate", "-m", str(smollm_path), "-p", "My favourite colour is", "-n", "12", "--json"]
    first, again = (json.loads(run_cli(*base, "--seed", "5").stdout) for _ in range(2))
    assert first["text"] == again["text"]
    others = {json.loads(run_cli(*base, "--seed", str(seed)).stdout)["text"] for seed in (6, 7, 8)}
    assert len(others | {first["text"]}) > 1, "four seeds gave one text: not sampled"
    greedy = json.loads(run_cli(*base, "--temp", "0", "--repeat-penalty", "1").stdout)
    model = ef.load(str(smollm_path))
    assert greedy["text"] == model.generate("My favourite colour is", 12).text


def test_budget_line_separates_the_baseline(smollm_path):
    """Under a budget, --json and the summary line say what the budget covers: peak RSS minus the
    RSS before loading, which stays within the budget."""
    args = ["generate", "-m", str(smollm_path), "-p", "Hello", "-n", "8", "--memory-budget", "120MB", "--temp", "0"]
    stats = json.loads(run_cli(*args, "--json").stdout)
    assert stats["memory_budget_bytes"] == 120_000_000
    assert stats["budget_used_bytes"] == stats["peak_rss_bytes"] - stats["baseline_rss_bytes"]
    assert 0 < stats["budget_used_bytes"] <= stats["memory_budget_bytes"]
    summary = run_cli(*args).stderr.strip().splitlines()[-1]
    assert "MiB before loading +" in summary and "MiB budget" in summary, summary


def test_chat_without_a_template_warns_once():
    proc = subprocess.run([sys.executable, "-m", "edgeflash.cli.main", "chat", "-m", "gemma3-270m", "-n", "4"],
                          input="Hi\n", capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    warnings = [line for line in proc.stderr.splitlines() if "no chat template" in line]
    assert len(warnings) == 1 and warnings[0].startswith("warning: ")
    with_template = subprocess.run([sys.executable, "-m", "edgeflash.cli.main", "chat", "-m", "smollm2-135m", "-n",
                                    "4"], input="Hi\n", capture_output=True, text=True, timeout=300)
    assert "no chat template" not in with_template.stderr


def test_models_lists_every_alias():
    from edgeflash.base.models import ALIASES

    proc = run_cli("models")
    assert proc.returncode == 0, proc.stderr
    listed = [line.split()[0] for line in proc.stdout.splitlines() if line and not line.startswith(" ")]
    assert listed == list(ALIASES)
    rows = [json.loads(line) for line in run_cli("models", "--json").stdout.splitlines()]
    assert [r["alias"] for r in rows] == list(ALIASES)
    for r in rows:
        assert r["bytes"] is None or r["bytes"] > 10_000_000
