"""Model aliases: the packaged-model assembly on small fake parts (the real download is not a unit test)."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import pytest

from edgeflash.base import packaged_models
from edgeflash.base.errors import UserError
from edgeflash.base.models import ALIASES, PACKAGED, resolve_model
from edgeflash.base.packaged_models import (PackagedModel, assemble_parts, cache_dir, ensure_assembled,
                                           find_part_file)


def fake_parts(folder: Path, sizes: list[int]) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    parts = []
    for n, size in enumerate(sizes, 1):
        part = folder / f"part{n:02d}.bin"
        part.write_bytes(bytes((n * 37 + i) % 251 for i in range(size)))
        parts.append(part)
    return parts


def test_parts_are_concatenated_in_order_through_a_small_buffer(tmp_path, monkeypatch):
    # A 7-byte buffer makes every part take several reads, and one part is empty.
    monkeypatch.setattr(packaged_models, "COPY_CHUNK_BYTES", 7)
    parts = fake_parts(tmp_path / "parts", [50, 0, 23, 7])
    expected = b"".join(p.read_bytes() for p in parts)
    target = tmp_path / "cache" / "model.gguf"
    target.parent.mkdir()
    assert assemble_parts(parts, target, hashlib.sha256(expected).hexdigest(), label="fake") == target
    assert target.read_bytes() == expected
    assert [p.name for p in target.parent.iterdir()] == ["model.gguf"]  # no temporary file left


def test_a_wrong_checksum_leaves_nothing_behind(tmp_path):
    parts = fake_parts(tmp_path / "parts", [10, 20])
    target = tmp_path / "cache" / "model.gguf"
    target.parent.mkdir()
    swapped = parts[1].read_bytes() + parts[0].read_bytes()  # the right bytes in the wrong order
    with pytest.raises(UserError, match=r"model 'fake': the 2 parts concatenate to sha256 [0-9a-f]{64}, expected"):
        assemble_parts(parts, target, hashlib.sha256(swapped).hexdigest(), label="fake")
    assert list(target.parent.iterdir()) == []


def test_part_files_are_found_by_number_with_or_without_leading_zeros():
    files = ["pkg/__init__.py", "pkg/data/part01.bin", "pkg/data/part11.bin", "other/part7.bin"]
    assert find_part_file(files, 1) == "pkg/data/part01.bin"
    assert find_part_file(files, 11) == "pkg/data/part11.bin"
    assert find_part_file(files, 7) == "other/part7.bin"
    assert find_part_file(files, 2) is None
    assert find_part_file(["a/part3.bin", "b/part03.bin"], 3) is None  # ambiguous: no guess


def test_an_assembled_file_in_the_cache_is_used_without_pip(tmp_path, monkeypatch):
    monkeypatch.setenv("EDGEFLASH_CACHE", str(tmp_path))
    model = PackagedModel("fake", "a test model", "fake.gguf", "no-such-package-part", 2, "0.0.1",
                          "0" * 64, 5, chat=False)
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "fake.gguf").write_bytes(b"GGUF!")
    assert ensure_assembled(model) == tmp_path / "models" / "fake.gguf"


def test_the_cache_folder_follows_the_environment(tmp_path, monkeypatch):
    monkeypatch.delenv("EDGEFLASH_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir() == tmp_path / "xdg" / "edgeflash" / "models"
    monkeypatch.setenv("EDGEFLASH_CACHE", str(tmp_path / "ef"))
    assert cache_dir() == tmp_path / "ef" / "models"


def test_an_unknown_alias_lists_the_known_ones():
    with pytest.raises(UserError) as info:
        resolve_model("qwen2.5-coder-7b")
    message = str(info.value)
    assert "qwen2.5-coder-7b" in message and "\n" not in message
    for alias in ALIASES:
        assert alias in message


def test_every_packaged_model_is_an_alias_with_a_full_checksum():
    for alias, model in PACKAGED.items():
        assert model.alias == alias and alias in ALIASES
        assert re.fullmatch(r"[0-9a-f]{64}", model.sha256), alias
        assert len(model.requirements) == model.parts and model.requirements[0].endswith(f"1=={model.version}")
