// Quantized GEMM on the panel layout (kernels.h) with AVX2: a 256-bit register holds one 4-byte
// word of 8 rows (a "row group": lane i = row 8g + i), so a word's dot product with 4 activation
// codes is maddubs + madd against the codes broadcast to every lane, with no horizontal sums. Both
// row groups of a panel are run in turn; the panel stays in L1 meanwhile. Per unit, in integers:
// isum = sum_k c[k] q[k] - o * S (o = the code offset, S = the activation code sum), then
// acc = fma(isum, a * dx, acc), and for q4_1 / q4_k acc += b * dx * S.
#pragma once

#include <algorithm>

#include "group_tiles.h"
#include "kernel_table.h"
#include "x86_common.h"

namespace ef::x86 {
namespace {

constexpr int kPanelRows = 16;
constexpr int kGroupRows = 8;
constexpr size_t kPanelPrefetch = 16 << 10;  // bytes requested ahead (see avx512_panel.h)

// Row group g of a panel: 32 bytes of the 64-byte vector of each word.
struct Group {
  const uint8_t* base;  // the panel
  int g;
  __m256i words(size_t off, int j) const {  // the j-th word after row byte off
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(base + kPanelRows * off + 64 * j + 32 * g));
  }
  __m256 half(size_t off) const {  // the fp16 field at row byte off (2-byte lanes) of the 8 rows
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(base + kPanelRows * off + 16 * g)));
  }
};

struct UnitScales {
  __m256 a, a_hi, b;
};

inline __m256i nib_lo(__m256i q) { return _mm256_and_si256(q, _mm256_set1_epi8(0x0F)); }
inline __m256i nib_hi(__m256i q) { return _mm256_and_si256(_mm256_srli_epi16(q, 4), _mm256_set1_epi8(0x0F)); }

// Formats: kBB, kShift (log2 of the code offset, -1 none), kCodeBits (of an unsigned code), kSigned (codes are int8: dot products
// take |c| and the sign moved onto x, so maddubs cannot saturate), kFloatBias, kSplit, kUnits (units a
// block); unit(G, u, w, sc): the 8 code words of unit u (register j = codes 4j..4j+3 of each row).
struct AQ4_0 {
  static constexpr int kBB = 18, kShift = 3, kCodeBits = 4;
  static constexpr Format kFormat = Format::q4_0;
  static constexpr int kUnits = 1;  // per block
  static constexpr bool kSigned = false, kFloatBias = false, kSplit = false;
  static inline void unit(const Group& G, int64_t u, __m256i w[8], UnitScales& sc) {
    const size_t at = static_cast<size_t>(u) * kBB;
    sc.a = G.half(at);
    for (int j = 0; j < 4; ++j) {
      const __m256i q = G.words(at + 2, j);
      w[j] = nib_lo(q);
      w[4 + j] = nib_hi(q);
    }
  }
};

struct AQ4_1 {
  static constexpr int kBB = 20, kShift = -1, kCodeBits = 4;
  static constexpr Format kFormat = Format::q4_1;
  static constexpr int kUnits = 1;  // per block
  static constexpr bool kSigned = false, kFloatBias = true, kSplit = false;
  static inline void unit(const Group& G, int64_t u, __m256i w[8], UnitScales& sc) {
    const size_t at = static_cast<size_t>(u) * kBB;
    sc.a = G.half(at);
    sc.b = G.half(at + 2);
    for (int j = 0; j < 4; ++j) {
      const __m256i q = G.words(at + 4, j);
      w[j] = nib_lo(q);
      w[4 + j] = nib_hi(q);
    }
  }
};

struct AQ5_0 {
  static constexpr int kBB = 22, kShift = 4, kCodeBits = 5;
  static constexpr Format kFormat = Format::q5_0;
  static constexpr int kUnits = 1;  // per block
  static constexpr bool kSigned = false, kFloatBias = false, kSplit = false;
  static inline void unit(const Group& G, int64_t u, __m256i w[8], UnitScales& sc) {
    const size_t at = static_cast<size_t>(u) * kBB;
    sc.a = G.half(at);
    const __m256i qh = G.words(at + 2, 0);
    // Element 4j + k takes bit 4j + k of qh: shift the lane right by 4j, copy its low byte to the
    // lane's 4 bytes and test bit k in byte k.
    const __m256i first = _mm256_setr_epi8(0, 0, 0, 0, 4, 4, 4, 4, 8, 8, 8, 8, 12, 12, 12, 12, 0, 0, 0, 0, 4, 4, 4, 4,
                                           8, 8, 8, 8, 12, 12, 12, 12);
    const __m256i bit = _mm256_set1_epi32(0x08040201), b16 = _mm256_set1_epi8(16);
    for (int j = 0; j < 8; ++j) {
      const __m256i q = G.words(at + 6, j % 4);
      const __m256i rep = _mm256_shuffle_epi8(_mm256_srlv_epi32(qh, _mm256_set1_epi32(4 * j)), first);
      const __m256i hi = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(rep, bit), bit), b16);
      w[j] = _mm256_or_si256(j < 4 ? nib_lo(q) : nib_hi(q), hi);
    }
  }
};

struct AQ8_0 {
  static constexpr int kBB = 34, kShift = -1, kCodeBits = 8;
  static constexpr Format kFormat = Format::q8_0;
  static constexpr int kUnits = 1;  // per block
  static constexpr bool kSigned = true, kFloatBias = false, kSplit = false;
  static inline void unit(const Group& G, int64_t u, __m256i w[8], UnitScales& sc) {
    const size_t at = static_cast<size_t>(u) * kBB;
    sc.a = G.half(at);
    for (int j = 0; j < 8; ++j) w[j] = G.words(at + 2, j);
  }
};

struct AQ4_K {
  static constexpr int kBB = 144, kShift = -1, kCodeBits = 4;
  static constexpr Format kFormat = Format::q4_k;
  static constexpr int kUnits = 8;  // per block
  static constexpr bool kSigned = false, kFloatBias = true, kSplit = false;
  static inline void unit(const Group& G, int64_t u, __m256i w[8], UnitScales& sc) {
    const size_t at = static_cast<size_t>(u / 8) * kBB;
    const int j = static_cast<int>(u % 8);
    const __m256i dd = G.words(at, 0);  // d | dmin << 16
    const __m256i s0 = G.words(at, 1), s1 = G.words(at, 2), s2 = G.words(at, 3);
    const __m256i lo16 = _mm256_set1_epi32(0xFFFF);
    const __m256 d = _mm256_cvtph_ps(_mm256_castsi256_si128(
        _mm256_permute4x64_epi64(_mm256_packus_epi32(_mm256_and_si256(dd, lo16), _mm256_setzero_si256()), 0x08)));
    const __m256 dmin = _mm256_cvtph_ps(_mm256_castsi256_si128(
        _mm256_permute4x64_epi64(_mm256_packus_epi32(_mm256_srli_epi32(dd, 16), _mm256_setzero_si256()), 0x08)));
    const __m256i m6 = _mm256_set1_epi32(63), m4 = _mm256_set1_epi32(15), m2 = _mm256_set1_epi32(3);
    __m256i s, mn;
    if (j < 4) {
      s = _mm256_and_si256(_mm256_srlv_epi32(s0, _mm256_set1_epi32(8 * j)), m6);
      mn = _mm256_and_si256(_mm256_srlv_epi32(s1, _mm256_set1_epi32(8 * j)), m6);
    } else {
      const int k = 8 * (j - 4);
      s = _mm256_or_si256(_mm256_and_si256(_mm256_srlv_epi32(s2, _mm256_set1_epi32(k)), m4),
                          _mm256_slli_epi32(_mm256_and_si256(_mm256_srlv_epi32(s0, _mm256_set1_epi32(k + 6)), m2), 4));
      mn = _mm256_or_si256(_mm256_and_si256(_mm256_srlv_epi32(s2, _mm256_set1_epi32(k + 4)), m4),
                           _mm256_slli_epi32(_mm256_and_si256(_mm256_srlv_epi32(s1, _mm256_set1_epi32(k + 6)), m2), 4));
    }
    sc.a = _mm256_mul_ps(d, _mm256_cvtepi32_ps(s));
    sc.b = _mm256_sub_ps(_mm256_setzero_ps(), _mm256_mul_ps(dmin, _mm256_cvtepi32_ps(mn)));
    for (int k = 0; k < 8; ++k) {
      const __m256i q = G.words(at + 16 + 32 * (j / 2), k);
      w[k] = j % 2 ? nib_hi(q) : nib_lo(q);
    }
  }
};

struct AQ6_K {
  static constexpr int kBB = 210, kShift = 5, kCodeBits = 6;
  static constexpr Format kFormat = Format::q6_k;
  static constexpr int kUnits = 8;  // per block
  static constexpr bool kSigned = false, kFloatBias = false, kSplit = true;
  static inline void unit(const Group& G, int64_t u, __m256i w[8], UnitScales& sc) {
    const size_t at = static_cast<size_t>(u / 8) * kBB;
    const int h = static_cast<int>(u % 8) / 4, v = static_cast<int>(u % 4);
    const __m256 d = G.half(at + 208);
    const __m256i sw = G.words(at + 192, 2 * h + v / 2);  // scales 8h + 2v, +1: bytes (2v) % 4, +1
    const int b0 = (2 * v) % 4;
    const __m256i lo = _mm256_srai_epi32(_mm256_sllv_epi32(sw, _mm256_set1_epi32(24 - 8 * b0)), 24);
    const __m256i hi = _mm256_srai_epi32(_mm256_sllv_epi32(sw, _mm256_set1_epi32(16 - 8 * b0)), 24);
    sc.a = _mm256_mul_ps(d, _mm256_cvtepi32_ps(lo));
    sc.a_hi = _mm256_mul_ps(d, _mm256_cvtepi32_ps(hi));
    const __m256i m2 = _mm256_set1_epi8(0x30);
    for (int k = 0; k < 8; ++k) {
      const __m256i l = G.words(at + 64 * h + 32 * (v & 1), k);
      const __m256i q = G.words(at + 128 + 32 * h, k);
      // bits 2v..2v+1 of each qh byte to bits 4-5
      const __m256i q2 = v == 0 ? _mm256_slli_epi16(q, 4)
                         : v == 1 ? _mm256_slli_epi16(q, 2)
                         : v == 2 ? q
                                  : _mm256_srli_epi16(q, 2);
      w[k] = _mm256_or_si256(v >= 2 ? nib_hi(l) : nib_lo(l), _mm256_and_si256(q2, m2));
    }
  }
};

// q3_k super-block: word 0-7 hmask, 8-23 qs, 24-26 the scale bytes, then d. Unit 4h + j: 2-bit
// fields j of qs bytes 32h.., bit 4h + j of hmask as code bit 2; scales 8h + 2j and 8h + 2j + 1,
// whose low nibbles h are bytes 2j, 2j + 1 of the scale bytes and whose high bit pairs 2h + j / 2
// are bytes 8 + 2 (j % 2), + 1.
struct AQ3_K {
  static constexpr int kBB = 110, kShift = 2, kCodeBits = 3;
  static constexpr Format kFormat = Format::q3_k;
  static constexpr int kUnits = 8;  // per block
  static constexpr bool kSigned = false, kFloatBias = false, kSplit = true;
  static inline void unit(const Group& G, int64_t u, __m256i w[8], UnitScales& sc) {
    const size_t at = static_cast<size_t>(u / 8) * kBB;
    const int h = static_cast<int>(u % 8) / 4, j = static_cast<int>(u % 4);
    const __m256 d = G.half(at + 108);
    const __m256i sw = G.words(at + 96, j / 2), hw = G.words(at + 96, 2);
    const int b0 = 2 * (j % 2), hs = 2 * (2 * h + j / 2);
    const __m256i m4 = _mm256_set1_epi32(15), m2 = _mm256_set1_epi32(3), off = _mm256_set1_epi32(32);
    auto scale = [&](int byte) {
      const __m256i lo = _mm256_and_si256(_mm256_srlv_epi32(sw, _mm256_set1_epi32(8 * byte + 4 * h)), m4);
      const __m256i hi = _mm256_and_si256(_mm256_srlv_epi32(hw, _mm256_set1_epi32(8 * byte + hs)), m2);
      const __m256i v = _mm256_sub_epi32(_mm256_or_si256(lo, _mm256_slli_epi32(hi, 4)), off);
      return _mm256_mul_ps(d, _mm256_cvtepi32_ps(v));
    };
    sc.a = scale(b0);
    sc.a_hi = scale(b0 + 1);
    const int s = 4 * h + j - 2;  // hmask bit 4h + j to bit 2 (16-bit shifts: no byte mixes in)
    const __m256i m3 = _mm256_set1_epi8(3), b2 = _mm256_set1_epi8(4);
    for (int k = 0; k < 8; ++k) {
      const __m256i q = G.words(at + 32 + 32 * h, k);
      const __m256i m = G.words(at, k);
      const __m256i hb = s >= 0 ? _mm256_srli_epi16(m, s) : _mm256_slli_epi16(m, -s);
      w[k] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q, 2 * j), m3), _mm256_and_si256(hb, b2));
    }
  }
};

template <int NT>
struct Tokens {
  const int8_t* q[NT];
  const float* d[NT];
  const int32_t* ns[NT];
  const float* s32[NT];
  Tokens(const Q8View& x, int64_t t0, bool split) {
    const int64_t cols = x.cols;
    for (int t = 0; t < NT; ++t) {
      q[t] = x.q + (t0 + t) * cols;
      d[t] = x.d + (t0 + t) * (cols / 32);
      ns[t] = split ? x.ns16 + (t0 + t) * (cols / 16) : x.ns32 + (t0 + t) * (cols / 32);
      s32[t] = x.s32 + (t0 + t) * (cols / 32);
    }
  }
};

template <class F>
inline __m256i sum_start(int32_t neg_sum) {
  if constexpr (F::kShift >= 0) {
    return _mm256_set1_epi32(neg_sum * (1 << F::kShift));
  } else {
    return _mm256_setzero_si256();
  }
}

// How many words' maddubs results an int16 lane can add up before the one madd that widens them:
// a pair of products is at most 2 * (2^bits - 1) * 128 in magnitude, so 8 words of 4-bit codes (3840
// each), 4 of 5-bit, 2 of 6-bit. Signed codes (|c| up to 128 against |x| up to 127) widen every word.
template <class F>
constexpr int kInt16Words = F::kSigned ? 1 : std::min(8, 32767 / (2 * ((1 << F::kCodeBits) - 1) * 128));

template <class F>
inline __m256i word_products(const __m256i w[8], const int8_t* x, int j) {  // int16 pairs of word j
  int32_t xw;
  std::memcpy(&xw, x + 4 * j, 4);
  const __m256i xb = _mm256_set1_epi32(xw);
  if constexpr (F::kSigned) {
    return _mm256_maddubs_epi16(_mm256_sign_epi8(w[j], w[j]), _mm256_sign_epi8(xb, w[j]));
  } else {
    return _mm256_maddubs_epi16(w[j], xb);
  }
}

// acc[i] += sum over words j in [J0, J1) of dot(w[j] row i, activation word j at x). Words are
// added in int16 in runs of kInt16Words (two chains, so the adds overlap) and widened once a run:
// maddubs and madd share the multiply ports, which bound this loop.
template <class F, int J0, int J1>
inline __m256i dot_words(__m256i acc, const __m256i w[8], const int8_t* x) {
  constexpr int kRun = std::min(kInt16Words<F>, J1 - J0);  // 1, 2, 4 or 8: whole runs
  static_assert((J1 - J0) % kRun == 0);
  const __m256i ones = _mm256_set1_epi16(1);
  for (int j = J0; j < J1; j += kRun) {
    __m256i even = word_products<F>(w, x, j);
    if constexpr (kRun > 1) {
      __m256i odd = word_products<F>(w, x, j + 1);
      for (int k = 2; k < kRun; k += 2) {
        even = _mm256_add_epi16(even, word_products<F>(w, x, j + k));
        odd = _mm256_add_epi16(odd, word_products<F>(w, x, j + k + 1));
      }
      even = _mm256_add_epi16(even, odd);
    }
    acc = _mm256_add_epi32(acc, _mm256_madd_epi16(even, ones));
  }
  return acc;
}

// This unit's slice of the next panel, requested while the current one is computed (null: none).
inline void prefetch_slice(const uint8_t* prefetch, int64_t u, size_t slice) {
  if (prefetch)
    for (size_t b = 0; b < slice; b += 64) _mm_prefetch(reinterpret_cast<const char*>(prefetch + u * slice + b), _MM_HINT_T0);
}

// A row group's outputs for one token: all kGroupRows of them, or the first `valid`.
inline void store_group(__m256 v, float* out, int valid) {
  if (valid >= kGroupRows) {
    _mm256_storeu_ps(out, v);
  } else {
    alignas(32) float tmp[8];
    _mm256_store_ps(tmp, v);
    for (int i = 0; i < valid; ++i) out[i] = tmp[i];
  }
}

// acc plus one unit's product with one token: its codes xq, scale dx, minus code sums ns (of the
// unit's halves for split formats) and dx times its code sum (*s32, read for float biases only).
template <class F>
inline __m256 add_unit(__m256 acc, const __m256i w[8], const UnitScales& sc, const int8_t* xq, float dx,
                       const int32_t* ns, const float* s32) {
  const __m256 d = _mm256_set1_ps(dx);
  if constexpr (F::kSplit) {
    const __m256i lo = dot_words<F, 0, 4>(sum_start<F>(ns[0]), w, xq);
    const __m256i hi = dot_words<F, 4, 8>(sum_start<F>(ns[1]), w, xq);
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(lo), _mm256_mul_ps(sc.a, d), acc);
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(hi), _mm256_mul_ps(sc.a_hi, d), acc);
  } else {
    const __m256i sum = dot_words<F, 0, 8>(sum_start<F>(ns[0]), w, xq);
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), _mm256_mul_ps(sc.a, d), acc);
    if constexpr (F::kFloatBias) acc = _mm256_fmadd_ps(sc.b, _mm256_set1_ps(*s32), acc);
    return acc;
  }
}

// Where a row group's units come from. PanelUnits: a panel-layout matrix, read in place, with the
// next panel's bytes requested meanwhile. RowUnits: 8 rows of the row layout (streamed weights, a
// head's shortlist rows): each block of the 8 rows is first transposed into the panel layout, in a
// buffer of one block column, and decoded from there by the same unit decoders. So every output
// takes exactly the steps it takes from panels: a matrix gives the same floats in either layout (a
// streamed layer equals a resident one), and rows keep the panels' decode-once speed for batches.
template <class F>
struct PanelUnits {
  Group G;
  const uint8_t* prefetch;  // the next panel (null: none)
  size_t slice;
  inline void unit(int64_t u, __m256i w[8], UnitScales& sc) {
    prefetch_slice(prefetch, u, slice);
    F::unit(G, u, w, sc);
  }
  void drop_prefetch() { prefetch = nullptr; }
};

// 8 rows x 8 consecutive 4-byte words from byte `off` of each row, transposed: register k holds
// word k of the 8 rows (lane i = row i), stored at dst + 64 k (group 0 of a panel's word vectors).
inline void transpose_words8(const uint8_t* const* rows, size_t off, uint8_t* dst) {
  __m256i r[8], t[8], u[8];
  for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(rows[i] + off));
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_epi32(r[i], r[i + 1]);  // words 0, 1 | 4, 5 of rows i, i + 1
    t[i + 1] = _mm256_unpackhi_epi32(r[i], r[i + 1]);  // words 2, 3 | 6, 7
  }
  for (int h = 0; h < 8; h += 4) {  // rows h..h+3
    u[h] = _mm256_unpacklo_epi64(t[h], t[h + 2]);      // word 0 | 4
    u[h + 1] = _mm256_unpackhi_epi64(t[h], t[h + 2]);  // word 1 | 5
    u[h + 2] = _mm256_unpacklo_epi64(t[h + 1], t[h + 3]);  // word 2 | 6
    u[h + 3] = _mm256_unpackhi_epi64(t[h + 1], t[h + 3]);  // word 3 | 7
  }
  for (int k = 0; k < 4; ++k) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + 64 * k), _mm256_permute2x128_si256(u[k], u[4 + k], 0x20));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + 64 * (k + 4)), _mm256_permute2x128_si256(u[k], u[4 + k], 0x31));
  }
}

// The same for 4 words (16 bytes a row).
inline void transpose_words4(const uint8_t* const* rows, size_t off, uint8_t* dst) {
  __m256i r[4];
  for (int i = 0; i < 4; ++i)  // rows i and 4 + i, one per 128-bit lane
    r[i] = _mm256_inserti128_si256(
        _mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(rows[i] + off))),
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(rows[4 + i] + off)), 1);
  const __m256i t0 = _mm256_unpacklo_epi32(r[0], r[1]), t1 = _mm256_unpackhi_epi32(r[0], r[1]);
  const __m256i t2 = _mm256_unpacklo_epi32(r[2], r[3]), t3 = _mm256_unpackhi_epi32(r[2], r[3]);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst), _mm256_unpacklo_epi64(t0, t2));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + 64), _mm256_unpackhi_epi64(t0, t2));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + 128), _mm256_unpacklo_epi64(t1, t3));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + 192), _mm256_unpackhi_epi64(t1, t3));
}

constexpr size_t kRowAhead = 512;

template <class F>
struct RowUnits {
  const uint8_t* rows[kGroupRows];  // lanes past the last valid row repeat row 0 (never stored)
  PanelFields fields;
  int64_t block = -1;  // the block now in buf
  size_t requested = 0;  // row bytes requested into the cache so far
  alignas(32) uint8_t buf[kPanelRows * F::kBB + 32];

  RowUnits(const RowsView& w, int64_t r, int valid) : fields(panel_fields(F::kFormat)) {
    for (int i = 0; i < kGroupRows; ++i) rows[i] = w.row(i < valid ? r + i : r);
  }
  // Block b of the 8 rows into buf, field by field, as group 0 of a panel's block column.
  void load_block(int64_t b) {
    const size_t at = static_cast<size_t>(b) * F::kBB;
    // 8 row streams defeat the hardware prefetcher: request each row's line kRowAhead bytes on.
    for (; requested < at + kRowAhead; requested += 64)
      for (int i = 0; i < kGroupRows; ++i) _mm_prefetch(reinterpret_cast<const char*>(rows[i] + requested), _MM_HINT_T0);
    for (int k = 0; k < fields.count; ++k) {
      const Field& fd = fields.f[k];
      uint8_t* dst = buf + kPanelRows * fd.offset;
      const size_t src = at + fd.offset;
      int l = 0;
      const int lanes = fd.size / fd.lane;
      if (fd.lane == 4) {
        for (; l + 8 <= lanes; l += 8) transpose_words8(rows, src + 4 * l, dst + 64 * l);
        if (l + 4 <= lanes) transpose_words4(rows, src + 4 * l, dst + 64 * l), l += 4;
      }
      for (; l < lanes; ++l)
        for (int i = 0; i < kGroupRows; ++i)
          std::memcpy(dst + (kPanelRows * l + i) * fd.lane, rows[i] + src + l * fd.lane, fd.lane);
    }
    block = b;
  }
  inline void unit(int64_t u, __m256i w[8], UnitScales& sc) {
    if (u / F::kUnits != block) load_block(u / F::kUnits);
    F::unit(Group{buf, 0}, u % F::kUnits, w, sc);
  }
  void drop_prefetch() {}
};

// One row group (outputs at yg: token t's at yg + t * ldy) for NT tokens in register tiles.
template <class F, int NT, class Units>
void group_tile(Units& src, int64_t nu, const Tokens<NT>& tk, float* yg, int64_t t0, int64_t ldy, int valid) {
  __m256 acc[NT];
  for (int t = 0; t < NT; ++t) acc[t] = _mm256_setzero_ps();
  for (int64_t u = 0; u < nu; ++u) {
    __m256i w[8];
    UnitScales sc;
    src.unit(u, w, sc);
    for (int t = 0; t < NT; ++t)
      acc[t] = add_unit<F>(acc[t], w, sc, tk.q[t] + 32 * u, tk.d[t][u], tk.ns[t] + (F::kSplit ? 2 : 1) * u,
                           tk.s32[t] + u);
  }
  for (int t = 0; t < NT; ++t) store_group(acc[t], yg + (t0 + t) * ldy, valid);
}

// Tokens [t0, t1) (at most kManyTokens) of one row group: each unit is decoded once for all of them,
// where tiles of 4 would decode it once a tile. The accumulators live in L1 instead of registers;
// per token they take the same add_unit steps as in group_tile, so both give the same bits.
constexpr int kManyTokens = 32;

template <class F, class Units>
void group_many(Units& src, int64_t nu, const Q8View& x, int64_t t0, int64_t t1, float* yg, int64_t ldy, int valid) {
  const int n = static_cast<int>(t1 - t0);
  const int64_t cols = x.cols, blocks = cols / 32;
  alignas(32) float acc[kManyTokens * kGroupRows];
  for (int t = 0; t < n; ++t) _mm256_store_ps(acc + kGroupRows * t, _mm256_setzero_ps());
  for (int64_t u = 0; u < nu; ++u) {
    __m256i w[8];
    UnitScales sc;
    src.unit(u, w, sc);
    for (int t = 0; t < n; ++t) {
      const int64_t row = t0 + t;
      const int32_t* ns = F::kSplit ? x.ns16 + row * (cols / 16) + 2 * u : x.ns32 + row * blocks + u;
      const __m256 a = add_unit<F>(_mm256_load_ps(acc + kGroupRows * t), w, sc, x.q + row * cols + 32 * u,
                                   x.d[row * blocks + u], ns, x.s32 + row * blocks + u);
      _mm256_store_ps(acc + kGroupRows * t, a);
    }
  }
  for (int t = 0; t < n; ++t) store_group(_mm256_load_ps(acc + kGroupRows * t), yg + (t0 + t) * ldy, valid);
}

// Every token of one row group: up to 4 in register tiles; more (a verification pass, a prompt)
// with each unit decoded once per kManyTokens. Only the first tile requests the next panel.
template <class F, class Units>
void group_all_tokens(Units& src, int64_t nu, const Q8View& x, int64_t t0, int64_t t1, float* yg, int64_t ldy,
                      int valid) {
  if (t1 - t0 > 4) {
    for (int64_t t = t0; t < t1; t += kManyTokens, src.drop_prefetch())
      group_many<F>(src, nu, x, t, std::min(t1, t + kManyTokens), yg, ldy, valid);
    return;
  }
  for (int64_t t = t0; t < t1; t += 4, src.drop_prefetch()) {
    switch (std::min<int64_t>(4, t1 - t)) {
      case 1: group_tile<F, 1>(src, nu, Tokens<1>(x, t, F::kSplit), yg, t, ldy, valid); break;
      case 2: group_tile<F, 2>(src, nu, Tokens<2>(x, t, F::kSplit), yg, t, ldy, valid); break;
      case 3: group_tile<F, 3>(src, nu, Tokens<3>(x, t, F::kSplit), yg, t, ldy, valid); break;
      default: group_tile<F, 4>(src, nu, Tokens<4>(x, t, F::kSplit), yg, t, ldy, valid); break;
    }
  }
}

template <class F>
void gemm_panels(const RowsView& w, int64_t r0, int64_t r1, const Q8View& x, int64_t t0, int64_t t1, float* y,
                 int64_t ldy) {
  for_each_group<kGroupRows>(w, r0, r1, kPanelPrefetch, y,
                             [&](const uint8_t* panel, int g, float* yp, int gv, const uint8_t* pf, size_t slice) {
    PanelUnits<F> src{Group{panel, g}, pf, slice};
    group_all_tokens<F>(src, w.cols / 32, x, t0, t1, yp + kGroupRows * g, ldy, gv);
  });
}

// The row layout in groups of 8 rows from r0 (any row; the last group may be partial).
template <class F>
void gemm_rows(const RowsView& w, int64_t r0, int64_t r1, const Q8View& x, int64_t t0, int64_t t1, float* y,
               int64_t ldy) {
  for (int64_t r = r0; r < r1; r += kGroupRows) {
    const int valid = static_cast<int>(std::min<int64_t>(kGroupRows, r1 - r));
    RowUnits<F> src(w, r, valid);
    group_all_tokens<F>(src, w.cols / 32, x, t0, t1, y + (r - r0), ldy, valid);
  }
}

}  // namespace
}  // namespace ef::x86
