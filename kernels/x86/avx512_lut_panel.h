// AVX-512 VNNI GEMM of q4_lut matrices in the panel layout (docs/weight-formats.md). Each row has
// its own 16-level table, so the codes are looked up row by row: the panel keeps a row's 16 nibble
// bytes of a block (and its table) in one 128-bit lane, vector a holding rows a, 4 + a, 8 + a and
// 12 + a, so one vpshufb decodes 16 codes of each of 4 rows with their own tables. The product
// then runs along the row: vpdpbusd against the block's 16 activation codes repeated in every
// 128-bit lane leaves 4 partial sums per row, and a 4-vector transpose-and-add turns the 4 vectors
// into one (lane i = row i): 8 shuffles for 16 codes of 16 rows, 6 more per token and block. With
// more than 8 tokens the looked-up panel is transposed once into the word layout of the other
// formats and run like them.
//
// The arithmetic per output is the row kernel's (PQ4_LUT in avx512_panel.h) exactly: per block,
// isum = sum_k (c[k] + 128) q[k] - 128 S as an exact int32 (only integer sums are reassociated),
// then acc = fma(float(isum), (s * (k * k)) * dx, acc). So panels and rows give the same floats,
// for any number of tokens.
#pragma once

#include "avx512_panel.h"

namespace ef::x86 {
namespace {


// Lane i = row i: the 4 vectors' 4 partial sums of each lane's row, added (vector a lane L = row 4L + a).
EF_INLINE __m512i lut_row_sums(const __m512i p[4]) {
  const __m512i u0 = _mm512_add_epi32(_mm512_unpacklo_epi32(p[0], p[1]), _mm512_unpackhi_epi32(p[0], p[1]));
  const __m512i u1 = _mm512_add_epi32(_mm512_unpacklo_epi32(p[2], p[3]), _mm512_unpackhi_epi32(p[2], p[3]));
  return _mm512_add_epi32(_mm512_unpacklo_epi64(u0, u1), _mm512_unpackhi_epi64(u0, u1));
}

// The codes of block u of a panel, looked up: lo[r] / hi[r] = codes 0-15 / 16-31 of rows 4L + r
// (128-bit lane L), as level + 128.
EF_INLINE void lut_block_codes(const uint8_t* col, const __m512i lut[4], __m512i lo[4], __m512i hi[4]) {
  const __m512i m = splat8(0x0F);
  for (int r = 0; r < 4; ++r) {
    const __m512i q = _mm512_loadu_si512(col + kPanelRows + 64 * r);
    lo[r] = _mm512_shuffle_epi8(lut[r], _mm512_and_si512(q, m));
    hi[r] = _mm512_shuffle_epi8(lut[r], _mm512_and_si512(_mm512_srli_epi16(q, 4), m));
  }
}

// Block u's scale vector (lane i = row i): s * k^2, as the row kernel computes it.
EF_INLINE __m512 lut_block_scales(const uint8_t* col, __m512 s) {
  const __m512 k = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(col))));
  return _mm512_mul_ps(s, _mm512_mul_ps(k, k));
}

EF_INLINE void lut_tables(const uint8_t* panel, __m512i lut[4]) {  // levels + 128 as unsigned bytes
  for (int a = 0; a < 4; ++a)
    lut[a] = _mm512_xor_si512(_mm512_loadu_si512(panel + kPanelRows * 4 + 64 * a), splat8(0x80));
}

// a[r] lane L dword j (codes 4j..4j+3 of row 4L + r) -> o[j] lane L dword r: the word layout of
// the other formats' panels (register j lane i = codes 4j..4j+3 of row i).
EF_INLINE void lut_words(const __m512i a[4], __m512i o[4]) {
  const __m512i t0 = _mm512_unpacklo_epi32(a[0], a[1]), t1 = _mm512_unpackhi_epi32(a[0], a[1]);
  const __m512i t2 = _mm512_unpacklo_epi32(a[2], a[3]), t3 = _mm512_unpackhi_epi32(a[2], a[3]);
  o[0] = _mm512_unpacklo_epi64(t0, t2);
  o[1] = _mm512_unpackhi_epi64(t0, t2);
  o[2] = _mm512_unpacklo_epi64(t1, t3);
  o[3] = _mm512_unpackhi_epi64(t1, t3);
}

// One tile of NT tokens over one panel of nu blocks.
template <int NT>
void lut_panel_tile(const uint8_t* panel, int64_t nu, const Q8View& x, int64_t t0, float* y, int64_t ldy,
                    __mmask16 valid, const Prefetch& pf) {
  const int64_t cols = x.cols;
  const __m512 s = _mm512_loadu_ps(panel);  // row scales
  __m512i lut[4];
  lut_tables(panel, lut);
  __m512 acc[NT];
  for (int t = 0; t < NT; ++t) acc[t] = _mm512_setzero_ps();
  for (int64_t u = 0; u < nu; ++u) {
    pf.step(u);
    const uint8_t* col = panel + kPanelRows * (kQ4LutHeaderBytes + u * kQ4LutBlockBytes);
    const __m512 a = lut_block_scales(col, s);
    __m512i lo[4], hi[4];
    lut_block_codes(col, lut, lo, hi);
    for (int t = 0; t < NT; ++t) {
      const int8_t* xq = x.q + (t0 + t) * cols + 32 * u;
      const __m512i xl = _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(xq)));
      const __m512i xh = _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(xq + 16)));
      __m512i p[4];
      for (int r = 0; r < 4; ++r)
        p[r] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), lo[r], xl), hi[r], xh);
      const __m512i isum =
          _mm512_add_epi32(lut_row_sums(p), _mm512_slli_epi32(_mm512_set1_epi32(x.ns32[(t0 + t) * (cols / 32) + u]), 7));
      const __m512 dx = _mm512_set1_ps(x.d[(t0 + t) * (cols / 32) + u]);
      acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(a, dx), acc[t]);
    }
  }
  store_tile<NT>(acc, y, t0, ldy, valid);
}

// More than 8 tokens: the whole panel looked up once into the other formats' word layout (scales
// into `tab`, codes into `codes`), then every tile of tokens runs the row kernel's tile over it
// from L1/L2, as PQ4_LUT does on rows: the per-token row sums would cost more than the lookups.
void lut_panel_many(const uint8_t* panel, int64_t nu, float* tab, __m512i* codes, const Q8View& x, int64_t t0,
                    int64_t t1, float* y, int64_t ldy, __mmask16 valid, const Prefetch& pf) {
  const __m512 s = _mm512_loadu_ps(panel);
  __m512i lut[4];
  lut_tables(panel, lut);
  for (int64_t u = 0; u < nu; ++u) {
    pf.step(u);
    const uint8_t* col = panel + kPanelRows * (kQ4LutHeaderBytes + u * kQ4LutBlockBytes);
    _mm512_store_ps(tab + u * kPanelRows, lut_block_scales(col, s));
    __m512i lo[4], hi[4], w[8];
    lut_block_codes(col, lut, lo, hi);
    lut_words(lo, w);
    lut_words(hi, w + 4);
    for (int g = 0; g < 8; ++g) _mm512_store_si512(codes + 8 * u + g, w[g]);
  }
  panel_tiles<PQ4_LUT>(codes, nu, tab, x, t0, t1, y, ldy, valid);
}

// Rows [r0, r1) in panels of 16, tokens [t0, t1): up to 8 along the rows, more through the word layout.
void gemm_q8_packed_lut(const RowsView& w, int64_t r0, int64_t r1, const Q8View& x, int64_t t0, int64_t t1, float* y,
                        int64_t ldy) {
  const int64_t nu = w.cols / 32, nt = t1 - t0;
  float* tab = nt > kTileTokens ? panel_scratch<float>(static_cast<size_t>(nu * kPanelRows), 0) : nullptr;
  __m512i* codes = nt > kTileTokens ? panel_scratch<__m512i>(static_cast<size_t>(nu * 8), 1) : nullptr;
  for_each_panel(w, r0, r1, nu, y, [&](int64_t p0, int, __mmask16 vm, float* yp, const Prefetch& pf) {
    const uint8_t* panel = w.panel(p0);
    switch (nt) {
      case 1: lut_panel_tile<1>(panel, nu, x, t0, yp, ldy, vm, pf); break;
      case 2: lut_panel_tile<2>(panel, nu, x, t0, yp, ldy, vm, pf); break;
      case 3: lut_panel_tile<3>(panel, nu, x, t0, yp, ldy, vm, pf); break;
      case 4: lut_panel_tile<4>(panel, nu, x, t0, yp, ldy, vm, pf); break;
      case 5: lut_panel_tile<5>(panel, nu, x, t0, yp, ldy, vm, pf); break;
      case 6: lut_panel_tile<6>(panel, nu, x, t0, yp, ldy, vm, pf); break;
      case 7: lut_panel_tile<7>(panel, nu, x, t0, yp, ldy, vm, pf); break;
      case 8: lut_panel_tile<8>(panel, nu, x, t0, yp, ldy, vm, pf); break;
      default: lut_panel_many(panel, nu, tab, codes, x, t0, t1, yp, ldy, vm, pf); break;
    }
  });
}

}  // namespace
}  // namespace ef::x86
