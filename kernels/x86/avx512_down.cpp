// AVX-512 level: the sparse FFN's down step (a sum of neurons' down columns scaled by their
// activations; also the column product of a bundle's dense FFN) as a register-tiled product. The
// outputs of a tile (up to 8 blocks of 32 for one token, 2 blocks for 4 tokens) stay in registers
// over every neuron and are stored once; each block is decoded once per tile into 32 floats
// (codes x scale) and multiplied into every token of the tile. The AVX2 level below adds each
// neuron into memory (a load, an FMA and a store per 8 outputs per neuron and token).
// Each output is the same sequence of operations in any tile: acc = 0, acc += h_i * w_i for the
// neurons in order, then out += acc, so a token's result does not depend on the batch around it.
#include <algorithm>

#include "kernel_table.h"
#include "x86_common.h"

namespace ef::x86 {
namespace {

// Decoders: block p -> the 32 weights as two vectors of 16 floats (elements 0-15, 16-31).
struct DQ8_0 {
  static constexpr size_t kBytes = 34;
  static inline void decode(const uint8_t* p, __m512& lo, __m512& hi) {
    const __m512 d = _mm512_set1_ps(h2f(p));
    lo = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 2)))));
    hi = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 18)))));
  }
};

struct DQ4_0 {  // w = d * (nibble - 8); element j: low nibble of byte j, element 16 + j: its high nibble
  static constexpr size_t kBytes = 18;
  static inline void decode(const uint8_t* p, __m512& lo, __m512& hi) {
    const float df = h2f(p);
    const __m512 d = _mm512_set1_ps(df), b = _mm512_set1_ps(-8.0f * df);
    const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 2)), m = _mm_set1_epi8(0x0F);
    lo = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_and_si128(q, m))), d, b);
    hi = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_and_si128(_mm_srli_epi16(q, 4), m))), d, b);
  }
};

struct DQ5_0 {  // w = d * ((nibble | bit j of qh << 4) - 16)
  static constexpr size_t kBytes = 22;
  static inline void decode(const uint8_t* p, __m512& lo, __m512& hi) {
    const float df = h2f(p);
    uint32_t qh;
    std::memcpy(&qh, p + 2, 4);
    const __m512 d = _mm512_set1_ps(df), b = _mm512_set1_ps(-16.0f * df);
    const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 6)), m = _mm_set1_epi8(0x0F);
    const __m512i sixteen = _mm512_set1_epi32(16);
    __m512i l = _mm512_cvtepu8_epi32(_mm_and_si128(q, m));
    __m512i h = _mm512_cvtepu8_epi32(_mm_and_si128(_mm_srli_epi16(q, 4), m));
    l = _mm512_mask_add_epi32(l, static_cast<__mmask16>(qh & 0xFFFF), l, sixteen);
    h = _mm512_mask_add_epi32(h, static_cast<__mmask16>(qh >> 16), h, sixteen);
    lo = _mm512_fmadd_ps(_mm512_cvtepi32_ps(l), d, b);
    hi = _mm512_fmadd_ps(_mm512_cvtepi32_ps(h), d, b);
  }
};

// Blocks [b0, b0 + BB) of tokens [t0, t0 + NT) over neurons [i0, i1):
// out[t, block] += sum_i h[t * cnt + i] * row_i[block]. With `ahead`, the same bytes of neuron i + ahead
// are requested while neuron i is read (the next group's rows, from DRAM in a forward pass).
template <class F, int NT, int BB>
inline void down_tile(const uint8_t* const* rows, const float* h, int64_t cnt, int64_t i0, int64_t i1, int64_t t0,
                      int64_t b0, int64_t dm, float* out, int64_t ahead, size_t pf_bytes) {
  __m512 acc[NT][2 * BB];
  for (int t = 0; t < NT; ++t)
    for (int j = 0; j < 2 * BB; ++j) acc[t][j] = _mm512_setzero_ps();
  for (int64_t i = i0; i < i1; ++i) {
    const uint8_t* p = rows[i] + static_cast<size_t>(b0) * F::kBytes;
    if (ahead && i + ahead < cnt)
      for (size_t b = 0; b < pf_bytes; b += 64) _mm_prefetch(reinterpret_cast<const char*>(rows[i + ahead]) + b, _MM_HINT_T0);
    __m512 hv[NT];
    for (int t = 0; t < NT; ++t) hv[t] = _mm512_set1_ps(h[(t0 + t) * cnt + i]);
    for (int j = 0; j < BB; ++j) {
      __m512 lo, hi;
      F::decode(p + j * F::kBytes, lo, hi);
      for (int t = 0; t < NT; ++t) {
        acc[t][2 * j] = _mm512_fmadd_ps(hv[t], lo, acc[t][2 * j]);
        acc[t][2 * j + 1] = _mm512_fmadd_ps(hv[t], hi, acc[t][2 * j + 1]);
      }
    }
  }
  for (int t = 0; t < NT; ++t)
    for (int j = 0; j < 2 * BB; ++j) {
      float* o = out + (t0 + t) * dm + 32 * b0 + 16 * j;
      _mm512_storeu_ps(o, _mm512_add_ps(_mm512_loadu_ps(o), acc[t][j]));
    }
}

constexpr int64_t kGroup = kDownGroup;  // neurons whose rows stay in L1/L2 while every tile of outputs reads them

// Tiles of BB blocks, then of BB/2, ... so every block of the outputs is covered.
template <class F, int NT, int BB>
inline void down_blocks(const uint8_t* const* rows, const float* h, int64_t cnt, int64_t i0, int64_t i1, int64_t t0,
                        int64_t b, int64_t dm, float* out, int64_t ahead, size_t pf_bytes) {
  const int64_t nb = dm / 32;
  for (; b + BB <= nb; b += BB, ahead = 0) down_tile<F, NT, BB>(rows, h, cnt, i0, i1, t0, b, dm, out, ahead, pf_bytes);
  if constexpr (BB > 1)
    if (b < nb) down_blocks<F, NT, BB / 2>(rows, h, cnt, i0, i1, t0, b, dm, out, ahead, pf_bytes);
}

// Many tokens (prefill): a group's rows are decoded once into floats (the same values the tiles
// decode on the fly), then tiles of 8 tokens x 32 outputs read them from cache: the decoding is
// not repeated for every 4 tokens.
template <int NT>
inline void float_tile(const float* w, const float* h, int64_t cnt, int64_t i0, int64_t i1, int64_t t0, int64_t c,
                       int64_t dm, float* out) {
  __m512 acc[NT][2];
  for (int t = 0; t < NT; ++t) acc[t][0] = acc[t][1] = _mm512_setzero_ps();
  for (int64_t i = i0; i < i1; ++i) {
    const float* row = w + (i - i0) * dm + c;
    const __m512 lo = _mm512_loadu_ps(row), hi = _mm512_loadu_ps(row + 16);
    for (int t = 0; t < NT; ++t) {
      const __m512 hv = _mm512_set1_ps(h[(t0 + t) * cnt + i]);
      acc[t][0] = _mm512_fmadd_ps(hv, lo, acc[t][0]);
      acc[t][1] = _mm512_fmadd_ps(hv, hi, acc[t][1]);
    }
  }
  for (int t = 0; t < NT; ++t)
    for (int j = 0; j < 2; ++j) {
      float* o = out + (t0 + t) * dm + c + 16 * j;
      _mm512_storeu_ps(o, _mm512_add_ps(_mm512_loadu_ps(o), acc[t][j]));
    }
}

template <class F>
void down_decoded(const uint8_t* const* rows, const float* h, int64_t cnt, int64_t i0, int64_t i1, int64_t n_tok,
                  int64_t dm, float* out, float* scratch) {
  float* w = scratch;  // kDownGroup * dm floats (no std container here: its instantiations would be
                       // weak symbols of an AVX-512 object, see the dispatch notes)
  for (int64_t i = i0; i < i1; ++i)
    for (int64_t b = 0; b < dm / 32; ++b) {
      __m512 lo, hi;
      F::decode(rows[i] + static_cast<size_t>(b) * F::kBytes, lo, hi);
      _mm512_storeu_ps(w + (i - i0) * dm + 32 * b, lo);
      _mm512_storeu_ps(w + (i - i0) * dm + 32 * b + 16, hi);
    }
  for (int64_t c = 0; c < dm; c += 32) {
    int64_t t = 0;
    for (; t + 8 <= n_tok; t += 8) float_tile<8>(w, h, cnt, i0, i1, t, c, dm, out);
    for (; t < n_tok; ++t) float_tile<1>(w, h, cnt, i0, i1, t, c, dm, out);
  }
}

constexpr int64_t kDecodeOnce = 16;  // tokens from which a group's rows are decoded once

template <class F>
void ffn_down_tiled(const uint8_t* const* rows, const float* h, int64_t cnt, int64_t n_tok, int64_t dm, float* out,
                    float* scratch) {
  const size_t row_part = static_cast<size_t>(dm / 32) * F::kBytes;
  for (int64_t i0 = 0; i0 < cnt; i0 += kGroup) {
    const int64_t i1 = std::min(cnt, i0 + kGroup);
    if (n_tok >= kDecodeOnce) {
      down_decoded<F>(rows, h, cnt, i0, i1, n_tok, dm, out, scratch);
      continue;
    }
    int64_t t = 0;
    for (; t + 4 <= n_tok; t += 4) down_blocks<F, 4, 2>(rows, h, cnt, i0, i1, t, 0, dm, out, t ? 0 : kGroup, row_part);
    switch (n_tok - t) {
      case 3: down_blocks<F, 3, 2>(rows, h, cnt, i0, i1, t, 0, dm, out, t ? 0 : kGroup, row_part); break;
      case 2: down_blocks<F, 2, 4>(rows, h, cnt, i0, i1, t, 0, dm, out, t ? 0 : kGroup, row_part); break;
      case 1: down_blocks<F, 1, 8>(rows, h, cnt, i0, i1, t, 0, dm, out, t ? 0 : kGroup, row_part); break;
      default: break;
    }
  }
}

// ---------------------------------------------------------------- q8_0 columns, int8 coefficients
// matmul_columns with ColumnActs q8 / q8x2; the definition is the scalar twin's (ref_linear.cpp),
// reproduced bit for bit. Per group of 32 columns (rows of the matrix): their block scales are read
// once, every token's coefficients h * scale are quantized per block into int8 scratch, then each
// block of 32 outputs is two 16-lane int32 products: the codes of 4 columns are interleaved into
// the 4 bytes of each lane (two unpacks and a 128-bit shuffle), offset to unsigned (+128, taken
// back through the coefficient sum), and one vpdpbusd adds 4 columns x 4 coefficients per lane.
// The interleaved registers of a block are built once and shared by every token of the batch.

// Codes 0-31 of columns r[0..3] at byte `off` -> W[0], W[1] (lane order above), signed.
inline void interleave4(const uint8_t* const* r, size_t off, __m512i W[2]) {
  auto ld = [&](int i) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(r[i] + off)); };
  const __m512i P = _mm512_inserti64x4(_mm512_castsi256_si512(ld(0)), ld(2), 1);
  const __m512i Q = _mm512_inserti64x4(_mm512_castsi256_si512(ld(1)), ld(3), 1);
  const __m512i lo = _mm512_unpacklo_epi8(P, Q), hi = _mm512_unpackhi_epi8(P, Q);
  const __m512i R = _mm512_shuffle_i64x2(lo, hi, 0x44), S = _mm512_shuffle_i64x2(lo, hi, 0xEE);
  W[0] = _mm512_unpacklo_epi16(R, S);
  W[1] = _mm512_unpackhi_epi16(R, S);
}

// Coefficient rows v0 .. v0 + NT - 1 (row v: token v / passes, pass v % passes) against block b.
// Coefficient codes are packed per 4 rows: cw[(v * 8 + k) * nbp + b] holds the codes + 128 (unsigned,
// for vpdpbusd) of rows 4k..4k+3 for block b. `corr` = -128 x the columns' code sums per lane starts
// every sum, so what is left is sum p c.
template <int NT>
inline void columns_tile(const __m512i (*W)[2], const __m512i corr[2], const int32_t* cw, const float* vs,
                         int64_t nbp, int64_t b, int64_t v0, int passes, float* out, int64_t dm) {
  __m512i acc[NT][2];
  for (int t = 0; t < NT; ++t) acc[t][0] = corr[0], acc[t][1] = corr[1];
  for (int k = 0; k < 8; ++k)
    for (int t = 0; t < NT; ++t) {
      const __m512i a = _mm512_set1_epi32(cw[((v0 + t) * 8 + k) * nbp + b]);
      acc[t][0] = _mm512_dpbusd_epi32(acc[t][0], a, W[k][0]);
      acc[t][1] = _mm512_dpbusd_epi32(acc[t][1], a, W[k][1]);
    }
  const __m512i i0 = _mm512_load_si512(kColumnLane.v), i1 = _mm512_load_si512(kColumnLane.v + 16);
  for (int t = 0; t < NT; ++t) {
    const int64_t v = v0 + t;
    const __m512i a0 = acc[t][0], a1 = acc[t][1];
    const __m512 s = _mm512_set1_ps(vs[v * nbp + b]);
    float* o = out + (v / passes) * dm + 32 * b;
    _mm512_storeu_ps(o, _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_permutex2var_epi32(a0, i0, a1)), s, _mm512_loadu_ps(o)));
    _mm512_storeu_ps(o + 16,
                     _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_permutex2var_epi32(a0, i1, a1)), s, _mm512_loadu_ps(o + 16)));
  }
}

// Block b of every coefficient row against the codes W of 32 columns: the -128 correction from the
// codes (vpdpbusd multiplies unsigned by signed, so the coefficients carry +128), then tiles of 4 rows.
inline void columns_block(const __m512i (*W)[2], const int32_t* cw, const float* vs, int64_t nbp, int64_t b,
                          int64_t nv, int passes, float* out, int64_t dm) {
  __m512i corr[2] = {_mm512_setzero_si512(), _mm512_setzero_si512()};
  const __m512i u128 = _mm512_set1_epi8(static_cast<char>(0x80));  // 128 as the unsigned operand
  for (int k = 0; k < 8; ++k) {
    corr[0] = _mm512_dpbusd_epi32(corr[0], u128, W[k][0]);  // 128 x the code sums, negated below
    corr[1] = _mm512_dpbusd_epi32(corr[1], u128, W[k][1]);
  }
  corr[0] = _mm512_sub_epi32(_mm512_setzero_si512(), corr[0]);
  corr[1] = _mm512_sub_epi32(_mm512_setzero_si512(), corr[1]);
  int64_t v = 0;
  for (; v + 4 <= nv; v += 4) columns_tile<4>(W, corr, cw, vs, nbp, b, v, passes, out, dm);
  switch (nv - v) {
    case 3: columns_tile<3>(W, corr, cw, vs, nbp, b, v, passes, out, dm); break;
    case 2: columns_tile<2>(W, corr, cw, vs, nbp, b, v, passes, out, dm); break;
    case 1: columns_tile<1>(W, corr, cw, vs, nbp, b, v, passes, out, dm); break;
    default: break;
  }
}

// The coefficients of one token and group for blocks [bc, bc + 16) (lane = block, so the maximum
// over the group's rows needs no horizontal reduction): `passes` quantizations into cw and vs.
inline void quantize_coefficients(const float* sc, int64_t nbp, int64_t bc, const float* h, int64_t gn, int passes,
                                  int64_t v0, int32_t* cw, float* vs) {
  alignas(64) float g[kColumnGroup][16];
  const __m512i lim = _mm512_set1_epi32(127), nlim = _mm512_set1_epi32(-127), off = _mm512_set1_epi32(128);
  for (int i = 0; i < kColumnGroup; ++i) {
    const __m512 hv = _mm512_set1_ps(i < gn ? h[i] : 0.0f);
    _mm512_store_ps(g[i], _mm512_mul_ps(hv, _mm512_loadu_ps(sc + i * nbp + bc)));
  }
  __m512 amax = _mm512_setzero_ps();
  for (int i = 0; i < kColumnGroup; ++i) amax = _mm512_max_ps(amax, _mm512_abs_ps(_mm512_load_ps(g[i])));
  for (int pass = 0; pass < passes; ++pass) {
    const bool residual = pass + 1 < passes;
    const __m512 s = _mm512_div_ps(amax, _mm512_set1_ps(127.0f));
    amax = _mm512_setzero_ps();  // of the residuals, for the next pass
    const __m512 id = _mm512_maskz_div_ps(_mm512_cmp_ps_mask(s, _mm512_setzero_ps(), _CMP_NEQ_OQ), _mm512_set1_ps(1.0f), s);
    const int64_t v = v0 + pass;
    for (int k = 0; k < 8; ++k) {
      __m512i packed = _mm512_setzero_si512();
      for (int j = 0; j < 4; ++j) {
        float* gi = g[4 * k + j];
        const __m512 x = _mm512_load_ps(gi);
        const __m512i p = _mm512_max_epi32(_mm512_min_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(x, id)), lim), nlim);
        packed = _mm512_or_si512(packed, _mm512_slli_epi32(_mm512_add_epi32(p, off), 8 * j));
        if (residual) {
          const __m512 rest = _mm512_fnmadd_ps(s, _mm512_cvtepi32_ps(p), x);
          _mm512_store_ps(gi, rest);
          amax = _mm512_max_ps(amax, _mm512_abs_ps(rest));
        }
      }
      _mm512_storeu_si512(cw + (v * 8 + k) * nbp + bc, packed);
    }
    _mm512_storeu_ps(vs + v * nbp + bc, s);
  }
}

void columns_q8_0(const uint8_t* const* rows, const float* h, int64_t cnt, int64_t n_tok, int64_t dm, float* out,
                  float* scratch, int passes) {
  const int64_t nb = dm / 32, nbp = (nb + 15) / 16 * 16, nv = n_tok * passes;
  float* sc = scratch;                                               // [32][nbp] block scales of the group
  int32_t* cw = reinterpret_cast<int32_t*>(scratch + 32 * nbp);      // [nv][8][nbp] packed coefficient codes
  float* vs = scratch + 32 * nbp + 8 * nv * nbp;                     // [nv][nbp] coefficient scales
  const size_t col_bytes = static_cast<size_t>(nb) * 34;
  for (int64_t i0 = 0; i0 < cnt; i0 += kColumnGroup) {
    const int64_t gn = std::min<int64_t>(kColumnGroup, cnt - i0);
    const uint8_t* r[kColumnGroup];  // rows past the end repeat the first (their coefficients are 0)
    for (int i = 0; i < kColumnGroup; ++i) r[i] = rows[i0 + (i < gn ? i : 0)];
    // The next group's columns, requested a slice per block while this one computes (an arena read
    // in place has its columns a bundle apart, which the hardware prefetcher does not follow).
    const int64_t next = i0 + kColumnGroup, next_n = std::max<int64_t>(0, std::min<int64_t>(kColumnGroup, cnt - next));
    const size_t lines = (col_bytes + 63) / 64;
    auto prefetch_next = [&](int64_t b) {
      const size_t l0 = static_cast<size_t>(b) * lines / nb, l1 = static_cast<size_t>(b + 1) * lines / nb;
      for (size_t l = l0; l < l1; ++l)
        for (int64_t i = 0; i < next_n; ++i) _mm_prefetch(reinterpret_cast<const char*>(rows[next + i]) + 64 * l, _MM_HINT_T0);
    };
    // Block scales (scalar loads: a 16-lane gather of the fp16 fields measured twice as slow here).
    for (int i = 0; i < kColumnGroup; ++i)
      for (int64_t b = 0; b < nbp; ++b) sc[i * nbp + b] = i < gn && b < nb ? h2f(r[i] + 34 * b) : 0.0f;
    for (int64_t t = 0; t < n_tok; ++t)
      for (int64_t bc = 0; bc < nb; bc += 16)
        quantize_coefficients(sc, nbp, bc, h + t * cnt + i0, gn, passes, t * passes, cw, vs);
    for (int64_t b = 0; b < nb; ++b) {
      prefetch_next(b);
      __m512i W[8][2];
      for (int k = 0; k < 8; ++k) interleave4(r + 4 * k, static_cast<size_t>(34 * b + 2), W[k]);
      columns_block(W, cw, vs, nbp, b, nv, passes, out, dm);
    }
  }
}

// The same product from column panels: the interleaved codes are loaded as they are and the block
// scales of a row are 16 fp16 values per load.
void columns_q8_0_packed(const uint8_t* packed, int64_t rows, int64_t nb, int64_t b0, int64_t nbw, const float* h,
                         int64_t n_tok, float* out, float* scratch, int passes) {
  const int64_t nbp = (nbw + 15) / 16 * 16, nv = n_tok * passes, dm = 32 * nbw;
  float* sc = scratch;
  int32_t* cw = reinterpret_cast<int32_t*>(scratch + 32 * nbp);
  float* vs = scratch + 32 * nbp + 8 * nv * nbp;
  const size_t group_bytes = static_cast<size_t>(kColumnGroup) * nb * 34, scale_bytes = static_cast<size_t>(64) * nb;
  for (int64_t i0 = 0; i0 < rows; i0 += kColumnGroup) {
    const uint8_t* g = packed + static_cast<size_t>(i0 / kColumnGroup) * group_bytes;
    const uint8_t* codes = g + scale_bytes + static_cast<size_t>(b0) * 1024;
    const uint8_t* next = i0 + kColumnGroup < rows ? codes + group_bytes : nullptr;
    if (next)
      for (int i = 0; i < kColumnGroup; i += 2)
        _mm_prefetch(reinterpret_cast<const char*>(g + group_bytes + (i * nb + b0) * 2), _MM_HINT_T0);
    for (int i = 0; i < kColumnGroup; ++i)
      for (int64_t bc = 0; bc < nbp; bc += 16) {
        const __mmask16 m = static_cast<__mmask16>(nbw - bc >= 16 ? 0xFFFF : (1u << (nbw - bc)) - 1);
        const __m256i f = _mm256_maskz_loadu_epi16(m, g + (i * nb + b0 + bc) * 2);
        _mm512_storeu_ps(sc + i * nbp + bc, _mm512_cvtph_ps(f));
      }
    for (int64_t t = 0; t < n_tok; ++t)
      for (int64_t bc = 0; bc < nbw; bc += 16)
        quantize_coefficients(sc, nbp, bc, h + t * rows + i0, kColumnGroup, passes, t * passes, cw, vs);
    for (int64_t b = 0; b < nbw; ++b) {
      const uint8_t* cb = codes + b * 1024;
      if (next)
        for (int l = 0; l < 16; ++l) _mm_prefetch(reinterpret_cast<const char*>(next + b * 1024 + 64 * l), _MM_HINT_T0);
      __m512i W[8][2];
      for (int k = 0; k < 8; ++k) {
        W[k][0] = _mm512_loadu_si512(cb + 128 * k);
        W[k][1] = _mm512_loadu_si512(cb + 128 * k + 64);
      }
      columns_block(W, cw, vs, nbp, b, nv, passes, out, dm);
    }
  }
}

}  // namespace
}  // namespace ef::x86

namespace ef {
void install_avx512_down(KernelTable& t) {
  using namespace x86;
  const char* n = "avx512";
  t.ffn_down[int(Format::q8_0)].set(ffn_down_tiled<DQ8_0>, n);
  t.ffn_down[int(Format::q4_0)].set(ffn_down_tiled<DQ4_0>, n);
  t.ffn_down[int(Format::q5_0)].set(ffn_down_tiled<DQ5_0>, n);
  t.columns_q8[int(Format::q8_0)].set(columns_q8_0, n);
  t.columns_q8_packed[int(Format::q8_0)].set(columns_q8_0_packed, n);
}
}  // namespace ef
