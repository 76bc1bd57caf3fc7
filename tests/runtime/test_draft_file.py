"""A draft model under a budget reads a copy of its GGUF file with its wider matrices in q4_0
(runtime/speculative/draft_file.py): the copy keeps every metadata byte and every other tensor,
converts what it should, is written once, and a budgeted run drafting from it stays inside its
budget with plain decoding's output."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from edgeflash.runtime.sources import open_model
from edgeflash.runtime.sources.gguf import GGUFFile
from edgeflash.runtime.speculative.draft_file import DRAFT_FILE_FORMAT, budgeted_draft_path


@pytest.fixture
def cache_home(tmp_path, monkeypatch):
    monkeypatch.setenv("EDGEFLASH_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_the_copy_converts_wider_matrices_and_keeps_everything_else(smollm_path, cache_home):
    copy = budgeted_draft_path(open_model(smollm_path, verify=False))
    assert copy.parent == cache_home / "models" / "draft-copies"
    original, converted = GGUFFile(smollm_path), GGUFFile(copy)
    with open(smollm_path, "rb") as a, open(copy, "rb") as b:  # magic, version, counts and metadata
        assert a.read(original.metadata_end) == b.read(original.metadata_end)
    assert sorted(converted.tensors) == sorted(original.tensors)
    # written layer group by group: a plan can keep a layer's attention and stream its FFN
    from edgeflash.runtime.budgeted import source_layout

    groups = source_layout(open_model(copy, verify=False)).groups
    for layer in range(original.metadata["llama.block_count"]):
        assert f"layer.{layer}.attention" in groups and f"layer.{layer}.ffn" in groups, layer
    changed = [n for n in original.tensors if converted.tensors[n].fmt != original.tensors[n].fmt]
    # SmolLM2's file: q4_1 matrices (5 bits a weight) and a q8_0 token embedding, read a row a token
    assert changed and all(original.tensors[n].fmt == "q4_1" for n in changed)
    assert original.tensors["token_embd.weight"].fmt == converted.tensors["token_embd.weight"].fmt == "q8_0"
    for name, info in original.tensors.items():
        before, after = original.tensor(name), converted.tensor(name)
        assert after.shape == before.shape, name
        if name not in changed:
            assert np.array_equal(after.raw, before.raw), name
            continue
        assert after.fmt == DRAFT_FILE_FORMAT
        want, got = before.dequantize()[:64], after.dequantize()[:64]
        # q4_0 steps are 1/8 of a block's largest magnitude; the error is at most half a step
        assert np.abs(got - want).max() <= np.abs(want).max() / 8, name
    # a q4_0 block of 32 weights takes 18 bytes, a q4_1 block 20
    sizes = [sum(f.tensors[n].nbytes for n in changed) for f in (original, converted)]
    assert 10 * sizes[1] == 9 * sizes[0]


def test_the_copy_is_written_once_and_a_changed_original_replaces_it(smollm_path, tmp_path, cache_home):
    first = budgeted_draft_path(open_model(smollm_path, verify=False))
    written = first.stat().st_mtime_ns
    assert budgeted_draft_path(open_model(smollm_path, verify=False)) == first
    assert first.stat().st_mtime_ns == written
    changed = tmp_path / smollm_path.name  # a file of the same name, written later
    changed.write_bytes(smollm_path.read_bytes())
    second = budgeted_draft_path(open_model(changed, verify=False))
    assert second != first and second.is_file()
    assert not first.exists()  # the copy of the earlier version is gone
    assert sorted(p.name for p in first.parent.iterdir()) == [second.name]  # no partial file left


def test_a_bundle_draft_model_is_read_as_it_is(smol_bundle, cache_home):
    """A bundle's matrices are in the formats its export chose; only a GGUF file is copied."""
    assert budgeted_draft_path(open_model(smol_bundle, verify=False)) == smol_bundle
    assert not (cache_home / "models" / "draft-copies").exists()


BUDGETED_DRAFT = textwrap.dedent("""
    import json, sys
    import edgeflash as ef
    from edgeflash.base.rss import current_rss_bytes, peak_rss_bytes, reset_peak_rss
    bundle, draft, budget = sys.argv[1], sys.argv[2], int(sys.argv[3])
    reset_peak_rss(); before = current_rss_bytes()
    m = ef.load(bundle, memory_budget=budget, context_length=256, kv_cache="q8_0",
                speculative=f"draft:{draft}")
    r = m.generate("Once upon a time, in a small village by the sea,", max_tokens=32)
    plain = m.generate("Once upon a time, in a small village by the sea,", max_tokens=32, speculative="none")
    print(json.dumps({"peak": peak_rss_bytes() - before, "budget": budget, "same": r.tokens == plain.tokens,
                      "draft_passes": r.stats["spec_by_drafter"].get("draft", {}).get("passes", 0),
                      "draft_file": str(m._drafter(f"draft:{draft}").model.engine.source.path)}))
""")


def test_a_budgeted_run_drafts_from_the_copy_inside_its_budget(smol_bundle, smollm_path, cache_home):
    """The copy is written during the load, so the peak below covers writing it too."""
    budget = int((smol_bundle / "weights.bin").stat().st_size * 1.2)
    env = {**os.environ, "EDGEFLASH_CACHE": str(cache_home)}
    args = [sys.executable, "-c", BUDGETED_DRAFT, str(smol_bundle), str(smollm_path), str(budget)]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=600, env=env, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["draft_file"].startswith(str(cache_home / "models" / "draft-copies")), out
    assert out["same"] and out["draft_passes"] > 0, out
    assert out["peak"] <= out["budget"], out
