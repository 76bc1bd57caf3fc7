"""edgeflash bundles: the directory `edgeflash export` writes and every runtime reads.

    from edgeflash.runtime.bundle import Bundle, load_bundle
    source = load_bundle("out/gemma-q4_0")          # ModelSource, checksums verified
    b = Bundle.open("out/gemma-q4_0")               # block table, tensor table, arenas
    buf = bytearray(b.blocks["layer.0.ffn"].nbytes)
    b.read_block_into("layer.0.ffn", buf); w = b.tensor_in(buf, "blk.0.ffn_up.weight")

Format: docs/bundle-format.md.
"""

from edgeflash.runtime.bundle.layout import (
    BLOCK_ALIGNMENT,
    FORMAT_VERSION,
    MAGIC,
    MANIFEST_FILE,
    TENSOR_ALIGNMENT,
    TOKENIZER_FILE,
    WEIGHTS_FILE,
    block_of_tensor,
)
from edgeflash.runtime.bundle.manifest import ArenaEntry, ArenaPart, BlockEntry, Manifest, TensorEntry
from edgeflash.runtime.bundle.reader import Bundle, load_bundle

__all__ = [
    "BLOCK_ALIGNMENT",
    "FORMAT_VERSION",
    "MAGIC",
    "MANIFEST_FILE",
    "TENSOR_ALIGNMENT",
    "TOKENIZER_FILE",
    "WEIGHTS_FILE",
    "ArenaEntry",
    "ArenaPart",
    "BlockEntry",
    "Bundle",
    "Manifest",
    "TensorEntry",
    "block_of_tensor",
    "load_bundle",
]
