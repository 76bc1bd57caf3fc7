// The panel loop of the row-group GEMM kernels (AVX2: kernels/x86/avx2_panel.h, NEON:
// kernels/arm/neon_panel.h): which panel, row group and tile of tokens comes next, and which
// bytes of the next panel to request meanwhile. No arithmetic: each level's group or tile does that.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "kernel_table.h"

namespace ef {

// Rows [r0, r1) in panels of kPanelRows, each in groups of GroupRows rows: group(panel, g, yp, gv,
// pf, slice) computes row group g of the panel for every token (gv the group's valid rows; yp the
// panel's outputs). Group 0 of each panel gets the panel `prefetch_bytes` on to request, a `slice`
// per block (null: nothing to request).
template <int GroupRows, class GroupFn>
void for_each_group(const RowsView& w, int64_t r0, int64_t r1, size_t prefetch_bytes, float* y,
                    const GroupFn& group) {
  const int64_t nu = w.cols / 32;
  const size_t panel_span = kPanelRows * w.stride;
  const int64_t rows = w.rows > 0 ? w.rows : r1;
  const int64_t ahead = std::max<int64_t>(1, static_cast<int64_t>(prefetch_bytes / panel_span));
  const size_t slice = (panel_span / static_cast<size_t>(nu) + 63) & ~static_cast<size_t>(63);
  for (int64_t p0 = r0; p0 < r1; p0 += kPanelRows) {
    const uint8_t* panel = w.panel(p0);
    const uint8_t* next = p0 + (ahead + 1) * kPanelRows <= rows ? panel + ahead * panel_span : nullptr;
    const int valid = static_cast<int>(std::min<int64_t>(kPanelRows, r1 - p0));
    for (int g = 0; g * GroupRows < valid; ++g)
      group(panel, g, y + (p0 - r0), valid - GroupRows * g, g == 0 ? next : nullptr, slice);
  }
}

// The same groups with tokens [t0, t1) in tiles of up to 4: tile(nt, panel, g, t, yp, gv, pf,
// slice), nt an std::integral_constant (the tile's tokens); only a group's first tile requests the
// next panel.
template <int GroupRows, class Tile>
void for_each_group_tile(const RowsView& w, int64_t r0, int64_t r1, int64_t t0, int64_t t1, size_t prefetch_bytes,
                         float* y, const Tile& tile) {
  for_each_group<GroupRows>(w, r0, r1, prefetch_bytes, y,
                            [&](const uint8_t* panel, int g, float* yp, int gv, const uint8_t* pf, size_t slice) {
    for (int64_t t = t0; t < t1; t += 4) {
      switch (std::min<int64_t>(4, t1 - t)) {
        case 1: tile(std::integral_constant<int, 1>{}, panel, g, t, yp, gv, pf, slice); break;
        case 2: tile(std::integral_constant<int, 2>{}, panel, g, t, yp, gv, pf, slice); break;
        case 3: tile(std::integral_constant<int, 3>{}, panel, g, t, yp, gv, pf, slice); break;
        default: tile(std::integral_constant<int, 4>{}, panel, g, t, yp, gv, pf, slice); break;
      }
      pf = nullptr;
    }
  });
}

}  // namespace ef
