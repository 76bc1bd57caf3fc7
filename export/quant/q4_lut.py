"""q4_lut by sensitivity-weighted k-means: one 16-level table per row, one scale per block of 32.

Layout (docs/weight-formats.md): per row an f32 scale `s` and 16 int8 levels, then per block of
32 values one byte `k` and 16 bytes of 4-bit indices; value = s * k^2 * levels[index].

Why both: a table per row alone cannot follow the magnitude of a block of 32 values the way
q4_0's per-block scale does, and on real tensors its error was about twice q4_0's. With the
block scale, the table only has to fit the *shape* of the block-normalized values, where a
non-uniform 16-level table beats q4_0's uniform grid.

The fit, per row (native: `kernels.quantize_q4_lut`, rows spread over the kernel threads):
1. block scales from each block's largest magnitude; values normalized by them;
2. the 16 levels: a 1-D k-means over the row's normalized values in which value j counts with
   weight E[x_j^2]^0.35 * scale^2 (E[x_j^2] weighs column j's share of the first-order output
   error sum_j E[x_j^2] dw_j^2; the damping keeps rare large columns from taking over the
   table), on a histogram of 1/2-level bins, started at weighted quantiles, then from the
   previous round's levels; snapped to int8 with the largest level at 127;
3. per block, a search over candidate scales (the previous round's, and six around the block's
   largest magnitude): indices to the nearest level, then the weighted least-squares scale (full
   E[x_j^2] weights) for those indices; the best candidate wins;
4. steps 2-3 in four rounds in all (the table is refit to the values as the blocks really
   scale them; each round lowers the weighted error);
5. the block scales rounded to s * k^2 (k = 0..255, s = the row's largest block scale / 255^2:
   relative steps of 2/k, finer than fp16's for every block above 1/60 of the row's largest),
   indices re-assigned to the rounded scales.
Nearest-level indices come from a per-row table over ceil(2u): the levels are integers, so the
lookup is exact and replaces 15 compares per value.
"""

from __future__ import annotations

import numpy as np
from edgeflash import kernels


def quantize_q4_lut(values: np.ndarray, importance: np.ndarray | None) -> np.ndarray:
    """float32 [rows, cols] -> uint8 [rows, row_bytes] in the q4_lut layout; `importance` [cols]
    (>= 0, as `methods.prepare_importance` returns it) weighs the columns, None weighs them alike."""
    return kernels.quantize_q4_lut(values, importance)
