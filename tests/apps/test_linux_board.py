"""The Linux-board sample: the launcher's budget from MemAvailable, its errors, a real start through
it with the health check, and the systemd unit."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

BOARD = Path(__file__).resolve().parents[2] / "apps" / "linux-board"
LAUNCH = BOARD / "edgeflash-launch"
HEALTH = BOARD / "edgeflash-health"
EDGEFLASH = str(Path(sys.executable).parent / "edgeflash")


def meminfo(tmp_path: Path, available_kib: int | None) -> Path:
    lines = ["MemTotal:        3884108 kB", "MemFree:          201560 kB"]
    if available_kib is not None:
        lines.append(f"MemAvailable:    {available_kib} kB")
    path = tmp_path / "meminfo"
    path.write_text("\n".join(lines + ["Buffers:           81244 kB"]) + "\n")
    return path


def launch(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    model = tmp_path / "model.gguf"
    model.touch()
    base = {"PATH": os.environ["PATH"], "EDGEFLASH_MODEL": str(model), "EDGEFLASH_THREADS": "4"}
    return subprocess.run(["sh", str(LAUNCH), *args], env={**base, **env}, capture_output=True, text=True, check=False,
                          timeout=30)


@pytest.mark.parametrize("available_mib, margin_mib, budget_mib", [
    (1024, 204, 820),  # 20 % of 1024 MiB
    (256, 64, 192),  # 20 % would be 51 MiB: the 64 MiB floor applies
    (7800, 1560, 6240),
])
def test_budget_is_available_memory_minus_margin(tmp_path, available_mib, margin_mib, budget_mib):
    proc = launch(tmp_path, "--dry-run", EDGEFLASH_MEMINFO=str(meminfo(tmp_path, available_mib * 1024)))
    assert proc.returncode == 0, proc.stderr
    assert f"MemAvailable {available_mib} MiB - margin {margin_mib} MiB -> memory budget {budget_mib} MiB" in proc.stderr
    assert proc.stdout.split() == ["edgeflash", "serve", "-m", str(tmp_path / "model.gguf"), "--host", "127.0.0.1",
                                   "--port", "8000", "-t", "4", "--memory-budget", f"{budget_mib}MiB"]


def test_budget_settings(tmp_path):
    info = str(meminfo(tmp_path, 2048 * 1024))
    proc = launch(tmp_path, "--dry-run", EDGEFLASH_MEMINFO=info, EDGEFLASH_MARGIN_PERCENT="50",
                  EDGEFLASH_ARGS="--max-tokens 64 --quiet", EDGEFLASH_HOST="0.0.0.0", EDGEFLASH_PORT="9000")
    assert proc.stdout.split()[4:] == ["--host", "0.0.0.0", "--port", "9000", "-t", "4", "--memory-budget",
                                       "1024MiB", "--max-tokens", "64", "--quiet"]
    assert "--memory-budget" not in launch(tmp_path, "--dry-run", EDGEFLASH_MEMORY_BUDGET="none").stdout
    assert launch(tmp_path, "--dry-run", EDGEFLASH_MEMORY_BUDGET="300MB").stdout.split()[-2:] == [
        "--memory-budget", "300MB"]


@pytest.mark.parametrize("env, fragment", [
    ({"EDGEFLASH_MODEL": ""}, "EDGEFLASH_MODEL is not set"),
    ({"EDGEFLASH_MODEL": "/nonexistent/model.gguf"}, "/nonexistent/model.gguf: no such file"),
    ({"EDGEFLASH_MARGIN_PERCENT": "lots"}, "EDGEFLASH_MARGIN_PERCENT=lots: expected a whole number"),
    ({"EDGEFLASH_MARGIN_PERCENT": "120"}, "expected less than 100"),
    ({"MEMINFO_AVAILABLE_KIB": "102400"}, "only 100 MiB available"),
    ({"MEMINFO_AVAILABLE_KIB": ""}, "no MemAvailable line"),
])
def test_launcher_errors_are_one_line(tmp_path, env, fragment):
    available = env.pop("MEMINFO_AVAILABLE_KIB", "1048576")
    info = meminfo(tmp_path, int(available) if available else None)
    proc = launch(tmp_path, "--dry-run", EDGEFLASH_MEMINFO=str(info), **env)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and fragment in lines[0], proc.stderr


def test_launch_serves_with_the_chosen_budget_and_health_check_answers(tmp_path, smollm_path):
    env = {**os.environ, "EDGEFLASH_MODEL": str(smollm_path), "EDGEFLASH_BIN": EDGEFLASH, "EDGEFLASH_PORT": "0",
           "EDGEFLASH_MEMINFO": str(meminfo(tmp_path, 1024 * 1024)), "EDGEFLASH_ARGS": "--max-tokens 8 --quiet"}
    proc = subprocess.Popen(["sh", str(LAUNCH)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        match = re.search(r"listening on (http://127\.0\.0\.1:\d+)", line)
        assert match, (line, proc.stderr.read() if proc.poll() is not None else "")
        url = match.group(1)
        health = subprocess.run([sys.executable, str(HEALTH), "--url", url, "--generate"], capture_output=True,
                                text=True, check=False, timeout=300)
        assert health.returncode == 0, health.stderr
        assert health.stdout.startswith("ok: SmolLM2-135M-Instruct.Q4_1 (")
        assert "generated 1 token" in health.stdout
        request = urllib.request.Request(url + "/v1/completions", data=json.dumps({"prompt": "Hi", "max_tokens": 2}
                                                                                  ).encode())
        with urllib.request.urlopen(request, timeout=300) as response:
            stats = json.loads(response.read())["edgeflash"]
        assert stats["memory_budget_bytes"] == 820 * 2**20  # 1024 MiB available - 20 % margin
    finally:
        proc.send_signal(signal.SIGTERM)  # the launcher exec'd the server: the signal reaches it directly
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert "memory budget 820 MiB" in err
    down = subprocess.run([sys.executable, str(HEALTH), "--url", url], capture_output=True, text=True, check=False, timeout=60)
    assert down.returncode == 1 and "is not healthy" in down.stderr


def test_systemd_unit_matches_the_installer(tmp_path):
    unit = (BOARD / "edgeflash.service").read_text()
    installer = (BOARD / "install.sh").read_text()
    exec_start = re.search(r"^ExecStart=(\S+)$", unit, re.MULTILINE).group(1)
    assert exec_start == "/opt/edgeflash/bin/edgeflash-launch" and "/opt/edgeflash/bin/" in installer
    assert "EnvironmentFile=/etc/default/edgeflash" in unit and "/etc/default/edgeflash" in installer
    env_file = (BOARD / "edgeflash.env").read_text()
    assert "EDGEFLASH_BIN=/opt/edgeflash/venv/bin/edgeflash" in env_file and "/opt/edgeflash/venv" in installer
    assert "EDGEFLASH_HOST=127.0.0.1" in env_file


def test_systemd_accepts_the_unit(tmp_path):
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed (Debian package systemd); the unit was not verified")
    # The same unit with its programs at their places in this checkout, so systemd can check them.
    unit = (BOARD / "edgeflash.service").read_text().replace("/opt/edgeflash/bin", str(BOARD))
    (tmp_path / "edgeflash.service").write_text(unit)
    proc = subprocess.run([analyze, "verify", str(tmp_path / "edgeflash.service")], capture_output=True, text=True, check=False,
                          timeout=60)
    assert proc.returncode == 0 and not proc.stderr.strip(), proc.stderr
