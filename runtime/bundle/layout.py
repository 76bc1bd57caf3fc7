"""The bundle's fixed layout rules, shared by the writer (edgeflash.export) and the reader.

A bundle is a directory: `manifest.json`, `tokenizer.json` and one `weights.bin`. weights.bin
is a sequence of blocks; each block starts at a multiple of BLOCK_ALIGNMENT and is zero-padded
to one, so any block can be read with direct I/O into an aligned buffer. Tensors inside a block
start at multiples of TENSOR_ALIGNMENT (SIMD loads, cache lines). Full spec: docs/bundle-format.md.
"""

from __future__ import annotations

from edgeflash.memory.layout import ALIGN, group_name, group_of_tensor

MAGIC = "edgeflash-bundle"
# 2: long numeric arrays in the manifest (calibration, arena orders) are packed (packed.py).
# 3: one copy of the FFN: a layer's `ffn` block holds its norms and its neuron arena, which the
#    dense path reads in place (no separate dense gate/up/down, no `neurons` block).
# Versions 1 and 2 (dense FFN blocks, arenas in `neurons` blocks) read as before.
FORMAT_VERSION = 3
MANIFEST_FILE = "manifest.json"
TOKENIZER_FILE = "tokenizer.json"
# The same tokenizer as the tables this version of edgeflash builds from it, so that opening a bundle
# does not build them: building parses the vocabulary into Python objects several times the size
# of the result (Gemma 3: a 36 MiB peak for 7.5 MiB kept), and a memory budget covers opening too.
TOKENIZER_TABLES_FILE = "tokenizer.tables"
WEIGHTS_FILE = "weights.bin"
BLOCK_ALIGNMENT = ALIGN  # direct-I/O granularity (4096: the logical block size of common flash devices)
TENSOR_ALIGNMENT = 64
NEURON_STRIDE_ALIGNMENT = 64  # each neuron bundle in an arena starts on a cache line

# Block kinds in file order: embedding, then per layer attention, ffn, neurons (versions 1-2, and
# `keep` bundles whose dense FFN is the source's bytes), predictor, then globals (final norm ...)
# and an untied head.
BLOCK_KINDS = ("embedding", "attention", "ffn", "neurons", "predictor", "globals", "head")
LAYER_BLOCK_KINDS = ("attention", "ffn", "neurons", "predictor")



def align_up(n: int, alignment: int) -> int:
    return -(-n // alignment) * alignment


# A bundle's blocks are the weight groups a budgeted run keeps or streams: one naming rule for both.
block_of_tensor = group_of_tensor
block_name = group_name


def block_sort_key(name: str) -> tuple[int, int, int]:
    """File order of blocks: embedding, layer 0 (attention, ffn, neurons, predictor), layer 1, ...,
    globals, head — the order a forward pass needs them, so streaming reads move forward."""
    if name == "embedding":
        return (0, 0, 0)
    if name.startswith("layer."):
        _, layer, kind = name.split(".", 2)
        return (1, int(layer), LAYER_BLOCK_KINDS.index(kind))
    return (2, 0, 0) if name == "globals" else (3, 0, 0)
