// GEMM of q4_lut matrices in the panel layout (docs/weight-formats.md) with AVX2. The panel keeps
// each row's 16 nibble bytes of a block (and its 16-level table) in a 128-bit lane, so a row's
// codes are one pshufb in its own table (two rows per register), and the product runs along the
// row: maddubs + madd against the block's 16 activation codes in both lanes leaves 4 partial sums
// per row, and a 4-register transpose-and-add gives the 8 rows of a row group in one register.
// Per block, in integers: isum = sum_k c[k] q[k], then acc = fma(isum, (s * k^2) * dx, acc).
#pragma once

#include "avx2_panel.h"

namespace ef::x86 {
namespace {


// Row group g (rows 8g..8g+7) against NT tokens. Register a (0-3) of a 64-byte quad field holds
// rows a, 4 + a, 8 + a, 12 + a by 128-bit lane; its half g holds rows 8g + a and 8g + 4 + a.
template <int NT>
void lut_group_tile(const uint8_t* panel, int g, int64_t nu, const Q8View& x, int64_t t0, float* y, int64_t ldy,
                    int valid, const uint8_t* prefetch, size_t slice) {
  const int64_t cols = x.cols;
  const __m256 s = _mm256_loadu_ps(reinterpret_cast<const float*>(panel) + kGroupRows * g);
  __m256i lut[4];
  for (int a = 0; a < 4; ++a)
    lut[a] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(panel + kPanelRows * 4 + 64 * a + 32 * g));
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 acc[NT];
  for (int t = 0; t < NT; ++t) acc[t] = _mm256_setzero_ps();
  for (int64_t u = 0; u < nu; ++u) {
    prefetch_slice(prefetch, u, slice);
    const uint8_t* col = panel + kPanelRows * (kQ4LutHeaderBytes + u * kQ4LutBlockBytes);
    const __m256 k = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(col + kGroupRows * g))));
    const __m256 a = _mm256_mul_ps(s, _mm256_mul_ps(k, k));
    __m256i lo[4], hi[4];
    for (int r = 0; r < 4; ++r) {
      const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(col + kPanelRows + 64 * r + 32 * g));
      lo[r] = _mm256_shuffle_epi8(lut[r], nib_lo(q));
      hi[r] = _mm256_shuffle_epi8(lut[r], nib_hi(q));
    }
    for (int t = 0; t < NT; ++t) {
      const int8_t* xq = x.q + (t0 + t) * cols + 32 * u;
      const __m256i xl = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(xq)));
      const __m256i xh = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(xq + 16)));
      __m256i p[4];
      for (int r = 0; r < 4; ++r) {  // |c| * (x with c's sign): pairs of products fit int16
        const __m256i pl = _mm256_maddubs_epi16(_mm256_sign_epi8(lo[r], lo[r]), _mm256_sign_epi8(xl, lo[r]));
        const __m256i ph = _mm256_maddubs_epi16(_mm256_sign_epi8(hi[r], hi[r]), _mm256_sign_epi8(xh, hi[r]));
        p[r] = _mm256_add_epi32(_mm256_madd_epi16(pl, ones), _mm256_madd_epi16(ph, ones));
      }
      const __m256i u0 = _mm256_add_epi32(_mm256_unpacklo_epi32(p[0], p[1]), _mm256_unpackhi_epi32(p[0], p[1]));
      const __m256i u1 = _mm256_add_epi32(_mm256_unpacklo_epi32(p[2], p[3]), _mm256_unpackhi_epi32(p[2], p[3]));
      const __m256i isum = _mm256_add_epi32(_mm256_unpacklo_epi64(u0, u1), _mm256_unpackhi_epi64(u0, u1));
      const __m256 dx = _mm256_set1_ps(x.d[(t0 + t) * (cols / 32) + u]);
      acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(a, dx), acc[t]);
    }
  }
  for (int t = 0; t < NT; ++t) store_group(acc[t], y + (t0 + t) * ldy + kGroupRows * g, valid);
}

void gemm_panels_lut(const RowsView& w, int64_t r0, int64_t r1, const Q8View& x, int64_t t0, int64_t t1, float* y,
                     int64_t ldy) {
  const int64_t nu = w.cols / 32;
  const auto tile = [&](auto nt, const uint8_t* panel, int g, int64_t t, float* yp, int gv, const uint8_t* pf,
                        size_t slice) {
    lut_group_tile<decltype(nt)::value>(panel, g, nu, x, t, yp, ldy, gv, pf, slice);
  };
  for_each_group_tile<kGroupRows>(w, r0, r1, t0, t1, kPanelPrefetch, y, tile);
}

}  // namespace
}  // namespace ef::x86
