"""The manifest's own checksum: `manifest_crc32`, the CRC-32 of the manifest without that key,
serialized canonically (keys sorted, no spaces, ASCII), so that its layout on disk does not matter
but every value does. Bundles of format 3 carry it; formats 1-2 predate it and are read without.
"""

from __future__ import annotations

import json
import zlib
from pathlib import Path
from typing import Any

from edgeflash.base.errors import IntegrityError, ModelFormatError

SEAL_KEY = "manifest_crc32"
SEALED_FROM_VERSION = 3


def manifest_crc32(manifest: dict[str, Any]) -> int:
    body = {k: v for k, v in manifest.items() if k != SEAL_KEY}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=True)
    return zlib.crc32(text.encode("ascii"))


def sealed(manifest: dict[str, Any]) -> dict[str, Any]:
    """The manifest with its checksum (replacing any earlier one)."""
    return {**{k: v for k, v in manifest.items() if k != SEAL_KEY}, SEAL_KEY: manifest_crc32(manifest)}


def check_seal(manifest: dict[str, Any], version: int, where: Path) -> None:
    if version < SEALED_FROM_VERSION and SEAL_KEY not in manifest:
        return
    value = manifest.get(SEAL_KEY)
    if value is None:
        raise ModelFormatError(f"{where}: {SEAL_KEY} is missing (bundle format {version} manifests carry their "
                               "own checksum)")
    if not isinstance(value, int) or isinstance(value, bool) or value != manifest_crc32(manifest):
        raise IntegrityError(f"{where}: checksum mismatch in the manifest itself ({SEAL_KEY}); the manifest was "
                             "modified or corrupted")
