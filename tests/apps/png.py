"""Decode the 8-bit RGB/RGBA, non-interlaced PNGs Chromium writes into rows of pixels (stdlib zlib)."""

from __future__ import annotations

import struct
import zlib


def decode(data: bytes) -> tuple[int, int, list[bytes]]:
    """(width, height, rows): each row holds width x channels bytes."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, header = 8, b"", None
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        chunk = data[pos + 8:pos + 8 + length]
        pos += 12 + length
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", chunk)
        elif kind == b"IDAT":
            idat += chunk
    assert header is not None, "PNG without IHDR"
    width, height, depth, color, _, _, interlace = header
    assert depth == 8 and color in (2, 6) and interlace == 0, f"unsupported PNG layout {header}"
    channels = 3 if color == 2 else 4
    stride = width * channels
    raw = zlib.decompress(idat)
    rows: list[bytes] = []
    previous = bytearray(stride)
    for y in range(height):
        kind = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):  # undo the per-row filter (PNG spec, section 9)
            left = line[i - channels] if i >= channels else 0
            up = previous[i]
            up_left = previous[i - channels] if i >= channels else 0
            if kind == 1:
                line[i] = (line[i] + left) & 255
            elif kind == 2:
                line[i] = (line[i] + up) & 255
            elif kind == 3:
                line[i] = (line[i] + (left + up) // 2) & 255
            elif kind == 4:
                p = left + up - up_left
                pa, pb, pc = abs(p - left), abs(p - up), abs(p - up_left)
                line[i] = (line[i] + (left if pa <= pb and pa <= pc else up if pb <= pc else up_left)) & 255
        rows.append(bytes(line))
        previous = line
    return width, height, rows


def dark_pixels(data: bytes, threshold: int = 110) -> int:
    """How many pixels are dark (like text ink on a light background)."""
    width, _, rows = decode(data)
    channels = len(rows[0]) // width if rows else 3
    count = 0
    for row in rows:
        for x in range(0, len(row), channels):
            if row[x] + row[x + 1] + row[x + 2] < 3 * threshold:
                count += 1
    return count
