"""kill -9 at any point of an export, with and without --force: the output path holds the old
bundle or the new one (complete, checksums intact), never anything else, and the next export
leaves nothing but the bundle behind.

Each run is `edgeflash export` killing itself just before its K-th file-system step
(kill_driver.py): before each block write and sync, each file of the tokenizer and manifest,
the removal of the in-progress marker, the rename or directory exchange and the removal of the old
bundle. The steps of the last stage (manifest, commit) are all taken; earlier ones, where every
step is a write into the temporary directory, evenly spaced (EDGEFLASH_KILL_EVERY_STEP=1 takes
every step)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from edgeflash.export.writer import clean_stale
from edgeflash.runtime.bundle import load_bundle

DRIVER = Path(__file__).with_name("kill_driver.py")
FAST = ["--calibration-tokens", "64", "--window-tokens", "32", "--eval-tokens", "0", "--predictor-rank", "0",
        "--top-tokens", "64", "--quiet"]
NEW, OLD = "q4_0", "q8_0"  # the new export's scheme and the one of the bundle it replaces
SPREAD = 4  # kill points among the block writes


@pytest.fixture(scope="module")
def small_gguf(tmp_path_factory, smollm_path) -> Path:
    from tiny_gguf import write_tiny_gguf

    return write_tiny_gguf(tmp_path_factory.mktemp("kill-gguf") / "small.gguf", smollm_path, layers=3, hidden=128,
                           ffn=256, heads=4, kv_heads=2)


class _Driver:
    """kill_driver.py --serve: each export a forked child of one process that imported the
    exporter once (a fresh interpreter per export would spend most of its time importing)."""

    def __init__(self, scratch: Path):
        self.scratch = scratch
        self.proc = subprocess.Popen([sys.executable, str(DRIVER), "--serve"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)

    def run(self, args: list[str]) -> subprocess.CompletedProcess:
        out, err = self.scratch / "stdout", self.scratch / "stderr"
        self.proc.stdin.write(json.dumps({"argv": args, "stdout": str(out), "stderr": str(err),
                                          "timeout": 600}) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        assert line, f"kill_driver.py --serve ended (status {self.proc.poll()})"
        answer = json.loads(line)
        assert answer["status"] is not None, "the export ran past the timeout"
        return subprocess.CompletedProcess([str(answer["pid"])], answer["status"], out.read_text(),
                                           err.read_text())  # args[0]: its pid

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


@pytest.fixture(scope="module")
def driver(tmp_path_factory):
    d = _Driver(tmp_path_factory.mktemp("kill-driver"))
    yield d
    d.close()


@pytest.fixture(scope="module")
def old_bundle(tmp_path_factory, small_gguf, driver) -> Path:
    out = tmp_path_factory.mktemp("kill-old") / "old"
    run = _export(driver, small_gguf, out, OLD, kill_at=0)
    assert run.returncode == 0, run.stderr[-2000:]
    return out


def _export(driver: _Driver, source: Path, out: Path, scheme: str, kill_at: int, force: bool = False,
            no_exchange: bool = False) -> subprocess.CompletedProcess:
    return driver.run([str(kill_at), *(["--no-exchange"] if no_exchange else []), "--", "export", str(source),
                       "-o", str(out), "--quant", scheme, *FAST, *(["-f"] if force else [])])


def _steps(run: subprocess.CompletedProcess) -> list[str]:
    line = next(line for line in run.stdout.splitlines() if line.startswith("steps "))
    return line[len("steps "):].split(",")


def _kill_points(steps: list[str]) -> list[int]:
    """1-based step numbers to kill at: every step from the manifest's write on, SPREAD before it."""
    if os.environ.get("EDGEFLASH_KILL_EVERY_STEP") == "1":
        return list(range(1, len(steps) + 1))
    # the tokenizer files and the manifest are the last three files opened before the commit
    opens = [i for i, name in enumerate(steps) if name == "open"]
    last_stage = opens[-3] if len(opens) >= 3 else 0
    early = sorted({1 + round(i * (last_stage - 1) / max(1, SPREAD - 1)) for i in range(SPREAD)})
    return sorted(set(early) | set(range(last_stage + 1, len(steps) + 1)))


def _scheme(bundle: Path) -> str:
    return load_bundle(bundle).info["manifest"]["quant"]["scheme"]  # every checksum verified


def _leftovers(out: Path) -> list[str]:
    return sorted(p.name for p in out.parent.iterdir() if p.name != out.name)


@pytest.mark.parametrize("force", [False, True], ids=["new-output", "replacing-with-force"])
def test_kill_at_any_step_leaves_old_or_new_bundle(tmp_path, small_gguf, old_bundle, driver, force):
    out = tmp_path / "out" / "bundle"
    out.parent.mkdir()
    if force:
        shutil.copytree(old_bundle, out)
    reference = _export(driver, small_gguf, out, NEW, kill_at=0, force=force)
    assert reference.returncode == 0, reference.stderr[-2000:]
    steps = _steps(reference)
    assert "exchange" in steps if force else "rename" in steps, steps
    points = _kill_points(steps)
    outcomes, left_behind = {"old": 0, "new": 0, "none": 0}, 0
    for k in points:
        shutil.rmtree(out, ignore_errors=True)
        if force:
            shutil.copytree(old_bundle, out)
        run = _export(driver, small_gguf, out, NEW, kill_at=k, force=force)
        assert run.returncode == -signal.SIGKILL, (k, steps[k - 1], run.returncode, run.stderr[-1000:])
        if force:
            scheme = _scheme(out)  # the old bundle or the new one, whole
            assert scheme in (OLD, NEW), (k, steps[k - 1], scheme)
            outcomes["old" if scheme == OLD else "new"] += 1
        elif out.exists():
            assert _scheme(out) == NEW, (k, steps[k - 1])
            outcomes["new"] += 1
        else:
            outcomes["none"] += 1
        # at most this run's temporary directory: the run cleaned what the previous kill left
        assert set(_leftovers(out)) <= {f"bundle.tmp-{run.args[0]}"}, (k, steps[k - 1], _leftovers(out))
        left_behind += bool(_leftovers(out))
    assert outcomes["old" if force else "none"] > 0 and outcomes["new"] > 0, outcomes
    assert left_behind, "no kill left anything to clean up"
    final = _export(driver, small_gguf, out, NEW, kill_at=0, force=True)
    assert final.returncode == 0, final.stderr[-2000:]
    assert _leftovers(out) == [] and _scheme(out) == NEW


def test_without_exchange_a_kill_between_the_renames_is_undone(tmp_path, small_gguf, old_bundle, driver):
    """Where the file system has no RENAME_EXCHANGE, the old bundle is moved aside before the new
    one takes its place; a kill in between leaves it as OUT.old-<pid>, and the next export puts it
    back before anything else."""
    out = tmp_path / "out" / "bundle"
    out.parent.mkdir()
    shutil.copytree(old_bundle, out)
    reference = _export(driver, small_gguf, out, NEW, kill_at=0, force=True, no_exchange=True)
    assert reference.returncode == 0, reference.stderr[-2000:]
    steps = _steps(reference)
    between = len(steps) - steps[::-1].index("rename")  # the second rename: the new bundle into place
    shutil.rmtree(out)
    shutil.copytree(old_bundle, out)
    run = _export(driver, small_gguf, out, NEW, kill_at=between, force=True, no_exchange=True)
    assert run.returncode == -signal.SIGKILL
    assert not out.exists() and [n for n in _leftovers(out) if ".old-" in n], _leftovers(out)
    notes: list[str] = []
    clean_stale(out, notes.append)  # what the next export does first
    assert _scheme(out) == OLD and _leftovers(out) == [], (notes, _leftovers(out))
    assert any("restored" in n for n in notes)
