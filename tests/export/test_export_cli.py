"""`edgeflash export` / `inspect` / `generate` on real bundles, and every output failure as one
clear line with exit status 2 — including a real SIGKILL in the middle of writing."""

from __future__ import annotations

import contextlib
import json
import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from edgeflash.base.errors import ModelFormatError
from edgeflash.runtime.bundle import load_bundle
from edgeflash.runtime.sources import open_model

# the cheapest export that still runs every stage: nothing to quantize, no arenas, little text
SMALL = ["--quant", "keep", "--no-neuron-arena", "--calibration-tokens", "64", "--window-tokens", "32", "--eval-tokens", "0",
         "--predictor-rank", "0", "--top-tokens", "256"]


def cli(*args: str, timeout: float = 600, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "edgeflash.cli.main", *args], capture_output=True, text=True,
                          timeout=timeout, check=False, **kw)


def assert_one_line_error(proc: subprocess.CompletedProcess, *fragments: str) -> None:
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = [line for line in proc.stderr.strip().splitlines() if line.startswith("edgeflash")]
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


@contextlib.contextmanager
def tmpfs(path: Path, size: str, read_only: bool = False):
    """A small file system mounted at `path` (needs root: the tests run as root in CI and here)."""
    path.mkdir(parents=True, exist_ok=True)
    opts = f"size={size}" + (",ro" if read_only else "")
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(path)], capture_output=True, text=True,
                          check=False)
    assert proc.returncode == 0, f"mounting a tmpfs failed ({proc.stderr.strip()}); these tests need root"
    try:
        yield path
    finally:
        subprocess.run(["umount", str(path)], check=False)


def test_export_inspect_generate(tmp_path, smollm_path):
    out = tmp_path / "smol-q4_0"
    proc = cli("export", str(smollm_path), "-o", str(out), "--quant", "q4_0", "--quiet", "--json", "--full-report",
               "--calibration-tokens", "128", "--window-tokens", "64", "--eval-tokens", "64", "--sparsity-levels", "0.5",
               "--predictor-rank", "8", "--top-tokens", "256")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "quality report" in proc.stdout and "round-to-nearest" in proc.stdout and "sparsity 50%" in proc.stdout
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["quant"]["scheme"] == "q4_0" and summary["report"]["perplexity"]["exported"] > 1
    assert "self-draft vocabulary: top 256 tokens" in proc.stdout and summary["calibration"]["top_tokens"] == 256

    proc = cli("inspect", str(out))
    assert proc.returncode == 0, proc.stderr
    for fragment in ("layer.29.ffn", "arena 1536 neurons", "perplexity on", "checksums: verified"):
        assert fragment in proc.stdout
    data = json.loads(cli("inspect", str(out), "--json").stdout)
    assert data["verified"] and data["blocks"][0]["name"] == "embedding" and data["calibration"]["top_tokens"] == 256
    assert sum(b["nbytes"] for b in data["blocks"]) == data["weights_bytes"]

    proc = cli("generate", "-m", str(out), "--engine", "reference", "-p", "Once upon a time", "-n", "8")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.startswith("Once upon a time") and len(proc.stdout.strip()) > len("Once upon a time")


@pytest.mark.parametrize("args,fragments", [
    (["--quant", "q3_zz"], ["unknown quant scheme 'q3_zz'"]),
    (["--quant", "mixed:ffn=q4_0@48"], ["group size 48 is impossible for q4_0"]),
    (["--quant", "q4_0", "--group-size", "64"], ["group size 64 is impossible for q4_0, whose blocks hold 32 values"]),
    (["--target", "tflite"], ["target 'tflite' is not available"]),
    (["--calibration", "/nonexistent/text.txt"], ["/nonexistent/text.txt", "cannot read the calibration text"]),
])
def test_bad_options_are_one_line(tmp_path, smollm_path, args, fragments):
    out = tmp_path / "out"
    assert_one_line_error(cli("export", str(smollm_path), "-o", str(out), "--quiet", *SMALL, *args), *fragments)
    assert not out.exists()


def test_existing_output(tmp_path, smollm_path):
    other = tmp_path / "notes"
    other.mkdir()
    (other / "todo.txt").write_text("keep me")
    assert_one_line_error(cli("export", str(smollm_path), "-o", str(other), "--quiet", *SMALL, "--force"),
                          "is not an edgeflash bundle; refusing to replace it")
    assert (other / "todo.txt").read_text() == "keep me"


def test_read_only_output(tmp_path, smollm_path):
    with tmpfs(tmp_path / "ro", "1m", read_only=True) as ro:
        assert_one_line_error(cli("export", str(smollm_path), "-o", str(ro / "bundle"), "--quiet", *SMALL),
                              str(ro), "read-only file system")


def test_full_disk(tmp_path, smollm_path):
    with tmpfs(tmp_path / "small", "16m") as small:
        assert_one_line_error(cli("export", str(smollm_path), "-o", str(small / "bundle"), "--quiet", *SMALL),
                              "not enough free space")
        assert list(small.iterdir()) == []


def test_write_error_midway_leaves_nothing(tmp_path, smollm_path):
    """A file size limit hit while weights.bin is being written (the same path as a disk filling
    up under the export): one line, exit 2, no bundle and no temporary directory left."""
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (20 << 20, 20 << 20))

    out = tmp_path / "bundle"
    proc = cli("export", str(smollm_path), "-o", str(out), "--quiet", *SMALL, preexec_fn=limit)
    assert_one_line_error(proc, "weights.bin", "file too large")
    assert list(tmp_path.iterdir()) == []


def test_killed_export_leaves_no_bundle_and_is_cleaned_up(tmp_path, smollm_path):
    out = tmp_path / "bundle"
    args = [sys.executable, "-m", "edgeflash.cli.main", "export", str(smollm_path), "-o", str(out), "--quiet", *SMALL]
    partial = None
    for _ in range(3):  # the write takes about a second; catch it mid-way
        proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        weights = tmp_path / f"bundle.tmp-{proc.pid}" / "weights.bin"
        deadline = time.time() + 600
        while proc.poll() is None and time.time() < deadline:
            if weights.exists() and weights.stat().st_size > 0:
                os.kill(proc.pid, signal.SIGKILL)
                break
            time.sleep(0.002)
        proc.wait()
        if proc.returncode == -signal.SIGKILL:
            partial = weights.parent
            break
        assert proc.returncode == 0, proc.stderr.read()[-2000:]
        subprocess.run(["rm", "-rf", str(out)], check=True)
    assert partial is not None, "could not kill the export while it was writing"
    assert partial.exists() and not out.exists()
    assert (partial / ".edgeflash-export-in-progress").exists()  # recognisable as an unfinished export
    assert not (partial / "manifest.json").exists()
    with pytest.raises(ModelFormatError, match="no such file"):
        open_model(out)
    with pytest.raises(ModelFormatError, match="not an edgeflash bundle|no manifest|neither manifest"):
        open_model(partial)

    proc = subprocess.run(args[:-len(SMALL) - 1] + SMALL, capture_output=True, text=True, timeout=600,
                          check=False)  # not --quiet: the clean-up note is printed
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert f"removed {partial}" in proc.stderr
    assert not partial.exists()
    load_bundle(out)
