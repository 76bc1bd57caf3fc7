"""Which addresses a server reaches, and the warning printed when that is beyond this machine."""

from __future__ import annotations

import ipaddress
import socket

from edgeflash.base.errors import UserError


def resolve_bind_address(host: str, port: int) -> tuple[socket.AddressFamily, str]:
    """The address family and numeric address `host` names (the first one getaddrinfo gives)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as e:
        raise UserError(f"--host {host!r}: cannot resolve this address ({e.strerror})") from None
    family, _, _, _, sockaddr = infos[0]
    return family, sockaddr[0]


def is_loopback(address: str) -> bool:
    """True for 127.0.0.0/8 and ::1 (an IPv4-mapped loopback too); False for wildcards and the rest."""
    try:
        ip = ipaddress.ip_address(address.split("%")[0])
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_loopback


def exposure_warning(address: str, port: int, has_api_key: bool) -> str:
    """The loud, multi-line notice for a server other machines can reach."""
    where = "every network interface" if ipaddress.ip_address(address.split("%")[0]).is_unspecified else address
    lines = [
        "!" * 78,
        f"WARNING: edgeflash serve is listening on {address}:{port} ({where}).",
        "WARNING: other machines that can reach this port can use the model, and with it this",
        "WARNING: machine's CPU and memory. The default, 127.0.0.1, keeps the server local.",
    ]
    if has_api_key:
        lines.append("WARNING: requests to /v1/* need the API key, but traffic is plain HTTP (not encrypted).")
    else:
        lines.append("WARNING: no --api-key is set: anyone who reaches the port can send requests.")
    lines.append("!" * 78)
    return "\n".join(lines)
