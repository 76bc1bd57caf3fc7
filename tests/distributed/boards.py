"""Boards on one machine: one network namespace per board, each with an eth0 (a TAP device) plugged
into a switch process that gives every link the latency and bandwidth of a real one. Traffic stays
inside the namespaces: the root namespace has no address on the boards' network.

    python tests/distributed/boards.py up 4 --link ethernet     # efb0..efb3 at 10.77.0.1..4
    python tests/distributed/boards.py run 4 -- python -c "..."  # rank k runs in namespace k (MPI)
    python tests/distributed/boards.py down                       # stop the switch, remove the namespaces

`up` first removes whatever an earlier `up` of the same prefix left (idempotent); `down` removes
it all and is a no-op when nothing is there. Needs root (`ip netns`, /dev/net/tun).

Why a switch process and not veth pairs with `tc netem`: this machine's kernel is built without
netem (CONFIG_NET_SCH_NETEM is not set; `tc qdisc ... netem` answers "Specified qdisc kind is
unknown"), and of the other qdiscs only htb and tbf exist, which shape bandwidth but cannot delay.
The switch does what netem would: each frame waits for its sender's uplink, takes len/rate on it,
crosses in `delay`, then takes len/rate on the receiver's downlink (full duplex, per direction).
It forwards by learned MAC address, as a hardware switch does; it carries MPI's own TCP traffic
and adds no protocol of its own. Frames are 9000-byte jumbo frames, so the switch handles few.

Links (latency is each direction's delay, so a ping's round trip is twice it plus the switch's own
forwarding time, which `ping_ms` measures):
  ethernet  1 Gbit/s, 0.1 ms each way (0.2 ms round trip: boards on one switch)
  wifi      300 Mbit/s, 1.5 ms each way (3 ms round trip)
  none      no shaping (the switch's own forwarding time only)

MPI across namespaces: `mpirun` runs in namespace 0, and its launch agent (normally ssh) is this
file's `agent` command, which starts each host's Open MPI daemon with `ip netns exec` in the
namespace that owns the host's address. Every process then talks over TCP through the switch,
as boards do.
"""

from __future__ import annotations

import argparse
import ctypes
import fcntl
import heapq
import os
import select
import shlex
import signal
import struct
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

DEFAULT_PREFIX = "efb"
SUBNET = "10.77.0"  # host k has SUBNET.(k+1)
PID_DIR = Path("/run/edgeflash-boards")
MTU = 9000  # jumbo frames: a hidden-size vector of a 7B model (14 KiB) in two frames
LINK_BPS = {"1gbit": 1e9, "300mbit": 300e6}


@dataclass(frozen=True)
class Link:
    delay_ms: float  # each direction
    rate: str | None  # tc rate, e.g. "1gbit"; None = unshaped


LINKS = {
    "ethernet": Link(0.1, "1gbit"),
    "wifi": Link(1.5, "300mbit"),
    "none": Link(0.0, None),
}


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], check=check, capture_output=True, text=True)


def _in_ns(ns: str, *cmd: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", "netns", "exec", ns, *cmd], check=check, capture_output=True, text=True)


def address(rank: int) -> str:
    return f"{SUBNET}.{rank + 1}"


def namespace(rank: int, prefix: str = DEFAULT_PREFIX) -> str:
    return f"{prefix}{rank}"


def _pid_file(prefix: str) -> Path:
    return PID_DIR / f"{prefix}.pid"


def existing(prefix: str = DEFAULT_PREFIX) -> list[str]:
    out = _ip("netns", "list").stdout.split("\n")
    names = [line.split()[0] for line in out if line.strip()]
    return [n for n in names if n.startswith(prefix) and n[len(prefix):].isdigit()]


def down(prefix: str = DEFAULT_PREFIX) -> None:
    """Stop the switch this prefix's `up` started and remove its namespaces (no-op when none)."""
    pid_file = _pid_file(prefix)
    if pid_file.exists():
        try:
            pid = int(pid_file.read_text())
            os.kill(pid, signal.SIGTERM)
            for _ in range(100):  # its TAP devices go when it exits
                os.kill(pid, 0)
                time.sleep(0.02)
        except (ValueError, ProcessLookupError):
            pass
        pid_file.unlink(missing_ok=True)
    for ns in existing(prefix):
        _ip("netns", "del", ns, check=False)


def up(n: int, link: str = "ethernet", prefix: str = DEFAULT_PREFIX) -> list[str]:
    """Create n hosts joined by the switch; returns their addresses (host k: `address(k)`)."""
    if link not in LINKS:
        raise ValueError(f"link {link!r}: expected one of {', '.join(LINKS)}")
    down(prefix)
    for k in range(n):
        _ip("netns", "add", namespace(k, prefix))
        _in_ns(namespace(k, prefix), "ip", "link", "set", "lo", "up")
    PID_DIR.mkdir(parents=True, exist_ok=True)
    switch = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--prefix", prefix, "switch", str(n),
                               "--link", link], stdout=subprocess.PIPE, text=True, start_new_session=True)
    ready = switch.stdout.readline().strip()
    if ready != "ready":
        switch.kill()
        down(prefix)
        raise RuntimeError(f"the board switch did not start (said {ready!r})")
    _pid_file(prefix).write_text(str(switch.pid))
    return [address(k) for k in range(n)]


def ping_ms(src: int, dst: int, count: int = 20, prefix: str = DEFAULT_PREFIX) -> float:
    """Median round trip from host src to host dst, in milliseconds."""
    out = _in_ns(namespace(src, prefix), "ping", "-c", str(count), "-i", "0.01", "-q", address(dst)).stdout
    line = next(x for x in out.splitlines() if "min/avg" in x)
    return float(line.split("=")[1].split("/")[1])


# -- the switch ------------------------------------------------------------------------------------

TUNSETIFF, IFF_TAP, IFF_NO_PI = 0x400454CA, 0x0002, 0x1000
PR_SET_TIMERSLACK = 29


def _open_tap(name: str) -> int:
    fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK)
    fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", name.encode(), IFF_TAP | IFF_NO_PI))
    return fd


def switch_main(n: int, link: str, prefix: str) -> int:
    """One TAP device per host (its eth0), frames forwarded by destination MAC. A frame leaving host
    k waits for k's uplink to be free, takes len/rate to send, `delay` to cross, then len/rate on
    the receiver's downlink: each direction of each link is a full-duplex `rate` with `delay`."""
    shape = LINKS[link]
    libc = ctypes.CDLL(None)
    libc.prctl(PR_SET_TIMERSLACK, 1000, 0, 0, 0)  # wake within ~1 us of a delivery time, not 50
    fds = []
    for k in range(n):
        tap = f"{prefix}{k}t"
        fds.append(_open_tap(tap))
        ns = namespace(k, prefix)
        _ip("link", "set", tap, "netns", ns)
        _in_ns(ns, "ip", "link", "set", tap, "name", "eth0")
        _in_ns(ns, "ip", "addr", "add", f"{address(k)}/24", "dev", "eth0")
        _in_ns(ns, "ip", "link", "set", "eth0", "mtu", str(MTU), "up")
    port_of_fd = {fd: k for k, fd in enumerate(fds)}
    ports: dict[bytes, int] = {}  # learned MAC -> port
    up_free, down_free = [0.0] * n, [0.0] * n
    byte_s = 1.0 / (LINK_BPS[shape.rate] / 8) if shape.rate else 0.0
    delay = shape.delay_ms / 1000
    queue: list[tuple[float, int, int, bytes]] = []  # (deliver at, sequence, port, frame)
    seq = 0
    stop = False

    def on_term(*_: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_term)
    print("ready", flush=True)
    while not stop:
        timeout = max(0.0, queue[0][0] - time.monotonic()) if queue else 0.5
        try:
            readable, _, _ = select.select(fds, [], [], timeout)
        except InterruptedError:
            continue
        now = time.monotonic()
        for fd in readable:
            src = port_of_fd[fd]
            while True:
                try:
                    frame = os.read(fd, 65536)
                except BlockingIOError:
                    break
                ports[frame[6:12]] = src
                dst = ports.get(frame[0:6])
                targets = [dst] if dst is not None and not frame[0] & 1 else [p for p in range(n) if p != src]
                sent = max(now, up_free[src]) + len(frame) * byte_s
                up_free[src] = sent
                for t in targets:
                    arrive = max(sent + delay, down_free[t]) + len(frame) * byte_s
                    down_free[t] = arrive
                    heapq.heappush(queue, (arrive, seq, t, frame))
                    seq += 1
        now = time.monotonic()
        while queue and queue[0][0] <= now:
            _, _, t, frame = heapq.heappop(queue)
            try:
                os.write(fds[t], frame)
            except OSError:
                pass  # the host's queue is full: dropped, as a switch would
    return 0


def agent_main(argv: list[str], prefix: str) -> int:
    """Open MPI's launch agent instead of ssh: `agent-PREFIX [options] HOST COMMAND...` runs COMMAND
    in the namespace whose address is HOST (no ':' in the name: Open MPI reads one as a list)."""
    while argv and argv[0].startswith("-"):  # ssh-style flags before the host (-x)
        argv = argv[1:]
    host, command = argv[0], " ".join(argv[1:])
    rank = int(host.rsplit(".", 1)[1]) - 1
    os.execvp("ip", ["ip", "netns", "exec", namespace(rank, prefix), "/bin/sh", "-c", command])


def mpirun_command(n: int, command: list[str], prefix: str = DEFAULT_PREFIX, extra: list[str] | None = None
                   ) -> list[str]:
    """`mpirun` across hosts 0..n-1 (one rank each, rank k on host k), run from namespace 0."""
    agent = f"{sys.executable} {Path(__file__).resolve()} agent-{prefix}"
    hosts = ",".join(f"{address(k)}:1" for k in range(n))
    return ["ip", "netns", "exec", namespace(0, prefix), "mpirun", "--allow-run-as-root", "-n", str(n),
            "--host", hosts, "--map-by", "node", "--mca", "plm_rsh_agent", agent,
            "--mca", "btl", "tcp,self", "--mca", "btl_tcp_if_include", "eth0", "--mca", "oob_tcp_if_include", "eth0",
            *(extra or []), *command]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0].startswith("agent-"):
        return agent_main(argv[1:], argv[0].split("-", 1)[1])
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--prefix", default=DEFAULT_PREFIX)
    sub = p.add_subparsers(dest="cmd", required=True)
    u = sub.add_parser("up")
    u.add_argument("n", type=int)
    u.add_argument("--link", default="ethernet", choices=sorted(LINKS))
    sub.add_parser("down")
    w = sub.add_parser("switch")
    w.add_argument("n", type=int)
    w.add_argument("--link", default="ethernet", choices=sorted(LINKS))
    r = sub.add_parser("run")
    r.add_argument("n", type=int)
    r.add_argument("command", nargs=argparse.REMAINDER)
    args = p.parse_args(argv)
    if args.cmd == "up":
        print(" ".join(up(args.n, args.link, args.prefix)))
    elif args.cmd == "down":
        down(args.prefix)
    elif args.cmd == "switch":
        return switch_main(args.n, args.link, args.prefix)
    else:
        command = args.command[1:] if args.command[:1] == ["--"] else args.command
        cmd = mpirun_command(args.n, command, args.prefix)
        print(shlex.join(cmd), file=sys.stderr)
        return subprocess.call(cmd)
    return 0


if __name__ == "__main__":
    sys.exit(main())
