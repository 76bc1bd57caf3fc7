"""Resident memory of the tokenizers of the two real models: it counts against the memory budget.

Each measurement runs in a fresh process, so that nothing else the test session allocated is
counted: RSS (VmRSS) is taken before the GGUF file is opened, then after the tokenizer is built
from its metadata and the metadata is dropped, and again after the tokenizer has encoded a
3000-character prompt, decoded it and streamed it back.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from edgeflash.export.corpus import heldout_text

MB = 1 << 20
# Resident bytes allowed for each model's tokenizer (Gemma 3: 262,144 tokens; SmolLM2: 49,152).
BOUNDS = {"gemma3": 12 * MB, "smollm2": 6 * MB}

_MEASURE = r"""
import gc, json, sys
from edgeflash.runtime.sources.gguf import GGUFFile
from edgeflash.base.rss import current_rss_bytes
from edgeflash.runtime.tokenizer import StreamDecoder, Tokenizer

text = sys.stdin.read()
gc.collect()
start = current_rss_bytes()
gguf = GGUFFile(sys.argv[1])
tok = Tokenizer.from_gguf_metadata(gguf.metadata)
del gguf
gc.collect()
built = current_rss_bytes() - start

ids = tok.encode(text)
decoded = tok.decode(ids)
stream = StreamDecoder(tok)
streamed = "".join(stream.push(token_id) for token_id in ids) + stream.flush()
gc.collect()
used = current_rss_bytes() - start
print(json.dumps({"built": built, "used": used, "tokens": len(ids), "round_trip": decoded == streamed}))
"""


@pytest.mark.parametrize("name", sorted(BOUNDS))
def test_tokenizer_resident_memory(name, request, tmp_path):
    path = request.getfixturevalue("gemma_path" if name == "gemma3" else "smollm_path")
    prompt = heldout_text()[1000:4000]
    # cwd: the repository root on sys.path would shadow installed packages (see conftest).
    result = subprocess.run([sys.executable, "-c", _MEASURE, str(path)], input=prompt, text=True,
                            capture_output=True, check=False, cwd=tmp_path, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    measured = json.loads(result.stdout.strip().splitlines()[-1])
    assert measured["tokens"] > 500 and measured["round_trip"]
    for stage in ("built", "used"):
        assert measured[stage] <= BOUNDS[name], (
            f"{name} tokenizer holds {measured[stage] / MB:.1f} MB resident once {stage}; "
            f"the bound is {BOUNDS[name] / MB:.0f} MB")


_HEADER_PAGES = r"""
import json, sys
from edgeflash.runtime.sources.gguf import GGUFFile

def file_rss():
    for line in open("/proc/self/status"):
        if line.startswith("RssFile:"):
            return int(line.split()[1]) * 1024

start = file_rss()
gguf = GGUFFile(sys.argv[1])
print(json.dumps({"header": gguf.data_start, "mapped": file_rss() - start, "keys": len(gguf.metadata)}))
"""


def test_opened_gguf_keeps_no_header_pages(gemma_path, tmp_path):
    """The header's values are parsed into Python objects; its pages (most of it Gemma 3's
    262,144-token vocabulary) must not stay mapped, where a budget would count them."""
    result = subprocess.run([sys.executable, "-c", _HEADER_PAGES, str(gemma_path)], text=True,
                            capture_output=True, check=False, cwd=tmp_path, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    measured = json.loads(result.stdout.strip().splitlines()[-1])
    assert measured["keys"] > 10 and measured["header"] > 4 * MB
    assert measured["mapped"] < MB, f"{measured['mapped'] / MB:.1f} MB of a {measured['header'] / MB:.1f} MB header stay mapped"
