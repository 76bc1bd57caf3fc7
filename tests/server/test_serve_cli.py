"""`edgeflash serve` as a user runs it: loopback unless told otherwise (checked on the real listening
socket), a loud warning otherwise, one-line errors, and a clean stop on SIGTERM and SIGINT."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from server_helpers import request

URL_LINE = re.compile(r"listening on (http://(\S+):(\d+))")


def start_serve(*args: str) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([sys.executable, "-m", "edgeflash.cli.main", "serve", "-m", "smollm2-135m",
                             "--port", "0", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    match = URL_LINE.search(line)
    if not match:
        proc.kill()
        raise AssertionError(f"no 'listening on' line: {line!r} {proc.stderr.read()}")
    return proc, match.group(1)


def stop(proc: subprocess.Popen, sig: int) -> tuple[int, str, str]:
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=60)
    return proc.returncode, out, err


def listening_addresses(pid: int) -> list[tuple[str, int]]:
    """(address, port) of every TCP socket in LISTEN state that process `pid` holds (Linux /proc)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    found = []
    for table, family in (("tcp", socket.AF_INET), ("tcp6", socket.AF_INET6)):
        for line in Path(f"/proc/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state != "0A" or inode not in inodes:  # 0A = LISTEN
                continue
            hex_addr, hex_port = local.split(":")
            raw = bytes.fromhex(hex_addr)
            # /proc prints the address as 32-bit words in host (little-endian) order
            raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
            found.append((socket.inet_ntop(family, raw), int(hex_port, 16)))
    return found


def test_listens_on_loopback_only_by_default_and_stops_on_sigterm():
    proc, url = start_serve()
    try:
        port = int(url.rsplit(":", 1)[1])
        assert url.startswith("http://127.0.0.1:")
        assert listening_addresses(proc.pid) == [("127.0.0.1", port)]
        status, _, health = request(url, "GET", "/health")
        assert status == 200 and health["status"] == "ok"
        status, _, models = request(url, "GET", "/v1/models")
        assert models["data"][0]["id"] == "SmolLM2-135M-Instruct.Q4_1"
        status, _, page = request(url, "GET", "/")
        assert status == 200 and "<title>edgeflash chat</title>" in page
    finally:
        code, out, err = stop(proc, signal.SIGTERM)
    assert code == 0, err
    assert "stopped" in out and "WARNING" not in err and "Traceback" not in err


def test_other_address_gets_a_loud_warning_and_stops_on_sigint():
    proc, url = start_serve("--host", "0.0.0.0", "--api-key", "s3cret")
    try:
        port = int(url.rsplit(":", 1)[1])
        assert listening_addresses(proc.pid) == [("0.0.0.0", port)]
        local = f"http://127.0.0.1:{port}"
        status, _, body = request(local, "GET", "/v1/models")
        assert status == 401 and body["error"]["code"] == "invalid_api_key"
        status, _, body = request(local, "GET", "/v1/models", headers={"Authorization": "Bearer s3cret"})
        assert status == 200
    finally:
        code, _, err = stop(proc, signal.SIGINT)
    assert code == 0, err
    assert "WARNING: edgeflash serve is listening on 0.0.0.0" in err and "every network interface" in err


@pytest.mark.parametrize("args, fragment", [
    (["--port", "70000"], "port = 70000"),
    (["--max-tokens", "0"], "--max-tokens"),
    (["--max-queue", "-1"], "--max-queue"),
    (["--host", "no-such-host.invalid"], "no-such-host.invalid"),
])
def test_bad_flags_are_one_line_errors(args, fragment):
    proc = subprocess.run([sys.executable, "-m", "edgeflash.cli.main", "serve", "-m", "smollm2-135m", *args],
                          capture_output=True, text=True, check=False, timeout=120)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and fragment in lines[0] and "Traceback" not in proc.stderr, proc.stderr


def test_port_in_use_is_a_one_line_error():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = subprocess.run([sys.executable, "-m", "edgeflash.cli.main", "serve", "-m", "smollm2-135m",
                               "--port", str(port)], capture_output=True, text=True, check=False, timeout=120)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "already in use" in lines[0], proc.stderr
