// GEMM of q4_lut matrices in the panel layout (docs/weight-formats.md) for aarch64, instantiated per
// level with a core for the 16-byte dot product (sdot, or smull + pairwise adds on ARMv8.0).
//
// The panel keeps each row's 16 nibble bytes of a block (and its 16-level table) in a 16-byte
// lane, so a row's codes are one tbl lookup in its own table, and the product runs along the row:
// dot(codes, 16 activation codes) leaves 4 partial sums per row, and two pairwise adds turn the 4
// rows of a row group (rows 4g..4g+3) into one register. Per block, in integers: isum = sum_k c[k]
// q[k] (exact: only integer sums are reassociated), then acc = fma(isum, (s * k^2) * dx, acc), the
// same float sequence for every output whatever the number of tokens.
#pragma once

#include <cstring>

#include "kernel_table.h"
#include "neon_common.h"
#include "neon_panel.h"

namespace ef::arm {
namespace {


// Row group g of a q4_lut panel: row 4g + j's 16-byte lanes sit at 64 j + 16 g of a 64-byte field.
template <class Core, int NT>
void lut_group_tile(const uint8_t* panel, int g, int64_t nu, const Q8View& x, int64_t t0, float* y, int64_t ldy,
                    int valid, const uint8_t* prefetch, size_t slice) {
  const int64_t cols = x.cols;
  const float32x4_t s = vld1q_f32(reinterpret_cast<const float*>(panel) + 4 * g);  // row scales
  int8x16_t lut[4];
  for (int j = 0; j < 4; ++j) lut[j] = vld1q_s8(reinterpret_cast<const int8_t*>(panel + kPanelRows * 4 + 64 * j + 16 * g));
  float32x4_t acc[NT];
  for (int t = 0; t < NT; ++t) acc[t] = vdupq_n_f32(0.0f);
  const uint8x16_t m = vdupq_n_u8(15);
  for (int64_t u = 0; u < nu; ++u) {
    prefetch_slice(prefetch, u, slice);
    const uint8_t* col = panel + kPanelRows * (kQ4LutHeaderBytes + u * kQ4LutBlockBytes);
    uint32_t kw;  // the 4 rows' block scale codes
    std::memcpy(&kw, col + 4 * g, 4);
    const float32x4_t k = vcvtq_f32_u32(vmovl_u16(vget_low_u16(vmovl_u8(vreinterpret_u8_u32(vdup_n_u32(kw))))));
    const float32x4_t a = vmulq_f32(s, vmulq_f32(k, k));
    int8x16_t lo[4], hi[4];
    for (int j = 0; j < 4; ++j) {
      const uint8x16_t q = vld1q_u8(col + kPanelRows + 64 * j + 16 * g);
      lo[j] = vqtbl1q_s8(lut[j], vandq_u8(q, m));
      hi[j] = vqtbl1q_s8(lut[j], vshrq_n_u8(q, 4));
    }
    for (int t = 0; t < NT; ++t) {
      const int8_t* xq = x.q + (t0 + t) * cols + 32 * u;
      const int8x16_t xa = vld1q_s8(xq), xb = vld1q_s8(xq + 16);
      int32x4_t p[4];
      for (int j = 0; j < 4; ++j) p[j] = Core::dot2(lo[j], xa, hi[j], xb);
      const int32x4_t isum = vpaddq_s32(vpaddq_s32(p[0], p[1]), vpaddq_s32(p[2], p[3]));
      acc[t] = vfmaq_f32(acc[t], vcvtq_f32_s32(isum), vmulq_f32(a, vdupq_n_f32(x.d[(t0 + t) * (cols / 32) + u])));
    }
  }
  for (int t = 0; t < NT; ++t) store_group(acc[t], y + (t0 + t) * ldy + kGroupRows * g, valid);
}

template <class Core>
void gemm_panels_lut(const RowsView& w, int64_t r0, int64_t r1, const Q8View& x, int64_t t0, int64_t t1, float* y,
                     int64_t ldy) {
  static_assert(kGroupRows == 4, "row group g of a q4_lut panel is rows 4g..4g+3");
  const int64_t nu = w.cols / 32;
  const auto tile = [&](auto nt, const uint8_t* panel, int g, int64_t t, float* yp, int gv, const uint8_t* pf,
                        size_t slice) {
    lut_group_tile<Core, decltype(nt)::value>(panel, g, nu, x, t, yp, ldy, gv, pf, slice);
  };
  for_each_group_tile<kGroupRows>(w, r0, r1, t0, t1, kPanelPrefetch, y, tile);
}

}  // namespace
}  // namespace ef::arm
