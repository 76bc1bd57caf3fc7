"""Speculative decoding: drafters propose a token tree, the target verifies it in one batched
pass (an ancestor mask keeps branches apart), and only the accepted path's keys/values stay.
Greedy output is identical to plain decoding; sampling uses rejection so the law is the target's."""

from edgeflash.runtime.speculative.decoder import SpeculativeDecoder, make_drafter
from edgeflash.runtime.speculative.tree import DraftTree

__all__ = ["DraftTree", "SpeculativeDecoder", "make_drafter"]
