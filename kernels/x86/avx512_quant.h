// AVX-512 VNNI quantized GEMM: two 32-element units per 512-bit register. Scales and offsets of
// a unit pair travel as 4-lane vectors [a0_lo, a0_hi, a1_lo, a1_hi] so their products with the
// activation scales are vector ops too, not per-unit scalar work.
//   emit.pair<P>(c, a4, b4)    c: 64 unsigned codes (unit 0 in the low 256 bits)
//                              w[k] = a4[2i + h] * c[k] + b4[2i + h]  for unit i, half h
#pragma once

#include "x86_quant.h"

namespace ef::x86 {
namespace {

inline __m512i join(__m256i lo, __m256i hi) { return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1); }

inline float hsum4(__m128 s) {
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

// Two floats into the low lanes (through __m128i, which may alias anything).
inline __m128 load2(const float* p) { return _mm_castsi128_ps(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))); }

// [v0, v1] -> [v0, v0, v1, v1]
inline __m128 dup_pairs(__m128 v) { return _mm_unpacklo_ps(v, v); }

// Two fp16 scales 2 and `gap` bytes apart -> [s0, s1, ?, ?] as floats.
inline __m128 two_halves(const uint8_t* p, int gap) {
  uint16_t a, b;
  std::memcpy(&a, p, 2);
  std::memcpy(&b, p + gap, 2);
  return _mm_cvtph_ps(_mm_cvtsi32_si128(static_cast<int>(a | (static_cast<uint32_t>(b) << 16))));
}

inline __m256i nibbles_lo(__m256i q) { return _mm256_and_si256(q, _mm256_set1_epi8(0x0F)); }
inline __m256i nibbles_hi(__m256i q) { return _mm256_and_si256(_mm256_srli_epi16(q, 4), _mm256_set1_epi8(0x0F)); }

// Two consecutive 32-block units: 16 code bytes each at `qs_off` inside blocks of `bb` bytes.
inline __m512i pair_nibbles(const uint8_t* p, int qs_off, int bb) {
  const __m256i q = _mm256_loadu2_m128i(reinterpret_cast<const __m128i*>(p + bb + qs_off),
                                        reinterpret_cast<const __m128i*>(p + qs_off));
  // lo: [lo0 | lo1], hi: [hi0 | hi1] -> [lo0 hi0 | lo1 hi1]
  const __m512i lohi = join(nibbles_lo(q), nibbles_hi(q));
  return _mm512_permutexvar_epi64(_mm512_setr_epi64(0, 1, 4, 5, 2, 3, 6, 7), lohi);
}

// Four consecutive 32-block units, 16 code bytes each at `qs_off` in blocks of `bb` bytes:
// two registers [lo0 hi0 | lo1 hi1] and [lo2 hi2 | lo3 hi3] (unit order = activation order).
inline void quad_nibbles(const uint8_t* p, int qs_off, int bb, __m512i* c01, __m512i* c23) {
  __m512i q = _mm512_castsi128_si512(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + qs_off)));
  q = _mm512_inserti32x4(q, _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + bb + qs_off)), 1);
  q = _mm512_inserti32x4(q, _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 2 * bb + qs_off)), 2);
  q = _mm512_inserti32x4(q, _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 3 * bb + qs_off)), 3);
  const __m512i m = _mm512_set1_epi8(0x0F);
  const __m512i lo = _mm512_and_si512(q, m), hi = _mm512_and_si512(_mm512_srli_epi16(q, 4), m);
  *c01 = _mm512_permutex2var_epi64(lo, _mm512_setr_epi64(0, 1, 8, 9, 2, 3, 10, 11), hi);
  *c23 = _mm512_permutex2var_epi64(lo, _mm512_setr_epi64(4, 5, 12, 13, 6, 7, 14, 15), hi);
}

// Four fp16 values at byte offsets Off + k * BB (k < 4) -> 4 floats, with one or two loads and
// one word permute instead of eight scalar steps. Loads stay inside the four blocks.
template <int Off, int BB>
inline __m128 quad_halves(const uint8_t* p) {
  constexpr int w = Off / 2, s = BB / 2;
  static_assert(Off % 2 == 0 && BB % 2 == 0, "fp16 fields at even offsets");
  const __m512i idx = _mm512_zextsi128_si512(_mm_setr_epi16(w, w + s, w + 2 * s, w + 3 * s, 0, 0, 0, 0));
  const __m512i a = _mm512_loadu_si512(p);
  if constexpr (Off + 3 * BB + 2 <= 64) {
    static_assert(4 * BB >= 64, "the load must not pass the fourth block");
    return _mm_cvtph_ps(_mm512_castsi512_si128(_mm512_permutexvar_epi16(idx, a)));
  } else {
    static_assert(4 * BB >= 128 && Off + 3 * BB + 2 <= 128, "two loads cover the four fields");
    const __m512i b = _mm512_loadu_si512(p + 64);
    return _mm_cvtph_ps(_mm512_castsi512_si128(_mm512_permutex2var_epi16(a, idx, b)));
  }
}

struct P_Q4_0 {
  using Single = Q4_0;
  static constexpr bool kSigned = false;
  template <int P, class E>
  static inline void pair(const uint8_t* p, const RowCtx&, E& e) {
    const __m128 a = dup_pairs(two_halves(p, 18));
    e.template pair<P>(pair_nibbles(p, 2, 18), a, _mm_mul_ps(a, _mm_set1_ps(-8.0f)));
  }
  template <class E>
  static inline void quad(const uint8_t* p, const RowCtx&, E& e) {
    __m512i c01, c23;
    quad_nibbles(p, 2, 18, &c01, &c23);
    const __m128 d = quad_halves<0, 18>(p), m8 = _mm_set1_ps(-8.0f);
    const __m128 a01 = _mm_unpacklo_ps(d, d), a23 = _mm_unpackhi_ps(d, d);
    e.template pair<0>(c01, a01, _mm_mul_ps(a01, m8));
    e.template pair<1>(c23, a23, _mm_mul_ps(a23, m8));
  }
};

struct P_Q4_1 {
  using Single = Q4_1;
  static constexpr bool kSigned = false;
  template <int P, class E>
  static inline void pair(const uint8_t* p, const RowCtx&, E& e) {
    e.template pair<P>(pair_nibbles(p, 4, 20), dup_pairs(two_halves(p, 20)), dup_pairs(two_halves(p + 2, 20)));
  }
  template <class E>
  static inline void quad(const uint8_t* p, const RowCtx&, E& e) {
    __m512i c01, c23;
    quad_nibbles(p, 4, 20, &c01, &c23);
    const __m128 d = quad_halves<0, 20>(p), m = quad_halves<2, 20>(p);
    e.template pair<0>(c01, _mm_unpacklo_ps(d, d), _mm_unpacklo_ps(m, m));
    e.template pair<1>(c23, _mm_unpackhi_ps(d, d), _mm_unpackhi_ps(m, m));
  }
};

struct P_Q5_0 {
  using Single = Q5_0;
  static constexpr bool kSigned = false;
  template <int P, class E>
  static inline void pair(const uint8_t* p, const RowCtx&, E& e) {
    uint32_t h0, h1;
    std::memcpy(&h0, p + 2, 4);
    std::memcpy(&h1, p + 24, 4);
    const __m512i bits = _mm512_movm_epi8(static_cast<__mmask64>(h0) | (static_cast<__mmask64>(h1) << 32));
    const __m512i c = _mm512_or_si512(pair_nibbles(p, 6, 22), _mm512_and_si512(bits, _mm512_set1_epi8(0x10)));
    const __m128 a = dup_pairs(two_halves(p, 22));
    e.template pair<P>(c, a, _mm_mul_ps(a, _mm_set1_ps(-16.0f)));
  }
  template <class E>
  static inline void quad(const uint8_t* p, const RowCtx&, E& e) {
    // The four blocks span 88 bytes: one full and one masked load (no byte past them is read),
    // then word permutes gather the four scales and the four 32-bit high-bit masks.
    const __m512i a = _mm512_loadu_si512(p);
    const __m512i b = _mm512_maskz_loadu_epi8((1ull << 24) - 1, p + 64);
    const __m512i d_idx = _mm512_zextsi128_si512(_mm_setr_epi16(0, 11, 22, 33, 0, 0, 0, 0));
    const __m512i h_idx = _mm512_zextsi128_si512(_mm_setr_epi16(1, 2, 12, 13, 23, 24, 34, 35));
    const __m128 d = _mm_cvtph_ps(_mm512_castsi512_si128(_mm512_permutex2var_epi16(a, d_idx, b)));
    const __m128i qh = _mm512_castsi512_si128(_mm512_permutex2var_epi16(a, h_idx, b));
    __m512i c01, c23;
    quad_nibbles(p, 6, 22, &c01, &c23);
    const __m512i b16 = _mm512_set1_epi8(0x10);
    c01 = _mm512_or_si512(c01, _mm512_and_si512(_mm512_movm_epi8(static_cast<__mmask64>(_mm_cvtsi128_si64(qh))), b16));
    c23 = _mm512_or_si512(c23, _mm512_and_si512(_mm512_movm_epi8(static_cast<__mmask64>(_mm_extract_epi64(qh, 1))), b16));
    const __m128 m16 = _mm_set1_ps(-16.0f);
    const __m128 a01 = _mm_unpacklo_ps(d, d), a23 = _mm_unpackhi_ps(d, d);
    e.template pair<0>(c01, a01, _mm_mul_ps(a01, m16));
    e.template pair<1>(c23, a23, _mm_mul_ps(a23, m16));
  }
};

struct P_Q8_0 {
  using Single = Q8_0;
  static constexpr bool kSigned = true;
  template <int P, class E>
  static inline void pair(const uint8_t* p, const RowCtx&, E& e) {
    const __m512i c = join(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 2)),
                           _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 36)));
    e.template pair<P>(c, dup_pairs(two_halves(p, 34)), _mm_setzero_ps());
  }
  template <class E>
  static inline void quad(const uint8_t* p, const RowCtx&, E& e) {
    const __m512i c01 = join(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 2)),
                             _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 36)));
    const __m512i c23 = join(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 70)),
                             _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 104)));
    const __m128 d = quad_halves<0, 34>(p);
    e.template pair<0>(c01, _mm_unpacklo_ps(d, d), _mm_setzero_ps());
    e.template pair<1>(c23, _mm_unpackhi_ps(d, d), _mm_setzero_ps());
  }
};

struct P_Q4_LUT {
  using Single = Q4_LUT;
  static constexpr bool kSigned = true;
  template <int P, class E>
  static inline void pair(const uint8_t* p, const RowCtx& ctx, E& e) {
    const __m512i idx = pair_nibbles(p, 0, 16);
    const __m512i lut = _mm512_broadcast_i32x4(_mm256_castsi256_si128(ctx.lut));
    e.template pair<P>(_mm512_shuffle_epi8(lut, idx), _mm_set1_ps(ctx.scale), _mm_setzero_ps());
  }
  template <class E>
  static inline void quad(const uint8_t* p, const RowCtx& ctx, E& e) {
    __m512i c01, c23;
    quad_nibbles(p, 0, 16, &c01, &c23);
    const __m512i lut = _mm512_broadcast_i32x4(_mm256_castsi256_si128(ctx.lut));
    const __m128 a = _mm_set1_ps(ctx.scale);
    e.template pair<0>(_mm512_shuffle_epi8(lut, c01), a, _mm_setzero_ps());
    e.template pair<1>(_mm512_shuffle_epi8(lut, c23), a, _mm_setzero_ps());
  }
};

// K-quants: the 8 units of a super-block go out as 4 pairs whose activations are contiguous.
struct P_Q4_K {
  using Single = Q4_K;
  static constexpr bool kSigned = false;
  template <int P, int K, class E>
  static inline void pair_at(const uint8_t* p, __m256 a8, __m256 b8, E& e) {
    const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 16 + 32 * K));
    const __m256i idx = _mm256_setr_epi32(2 * K, 2 * K, 2 * K + 1, 2 * K + 1, 0, 0, 0, 0);
    e.template pair<P>(join(nibbles_lo(q), nibbles_hi(q)), _mm256_castps256_ps128(_mm256_permutexvar_ps(idx, a8)),
                       _mm256_castps256_ps128(_mm256_permutexvar_ps(idx, b8)));
  }
  template <int P, class E>
  static inline void superblock(const uint8_t* p, E& e) {
    // The 12 scale bytes hold 8 six-bit scales and 8 six-bit minimums; unpack them four at a
    // time in general registers (one vector load then, instead of eight scalar round trips).
    uint32_t w[3];
    std::memcpy(w, p + 4, 12);
    const uint32_t sc_lo = w[0] & 0x3F3F3F3Fu, m_lo = w[1] & 0x3F3F3F3Fu;
    const uint32_t sc_hi = (w[2] & 0x0F0F0F0Fu) | ((w[0] >> 2) & 0x30303030u);
    const uint32_t m_hi = ((w[2] >> 4) & 0x0F0F0F0Fu) | ((w[1] >> 2) & 0x30303030u);
    const __m128i sc = _mm_cvtsi64_si128(static_cast<long long>(sc_lo | (static_cast<uint64_t>(sc_hi) << 32)));
    const __m128i mn = _mm_cvtsi64_si128(static_cast<long long>(m_lo | (static_cast<uint64_t>(m_hi) << 32)));
    const __m256 a8 = _mm256_mul_ps(_mm256_set1_ps(h2f(p)), _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(sc)));
    const __m256 b8 = _mm256_mul_ps(_mm256_set1_ps(-h2f(p + 2)), _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(mn)));
    pair_at<0, 0>(p, a8, b8, e);
    pair_at<1, 1>(p, a8, b8, e);
    pair_at<0, 2>(p, a8, b8, e);
    pair_at<1, 3>(p, a8, b8, e);
  }
};

struct P_Q6_K {
  using Single = Q6_K;
  static constexpr bool kSigned = false;
  template <int P, class E>
  static inline void superblock(const uint8_t* p, E& e) {
    const __m128 d = _mm_set1_ps(h2f(p + 208));
    const __m256i m4 = _mm256_set1_epi8(0x0F), m2 = _mm256_set1_epi8(0x30);
    for (int half = 0; half < 2; ++half) {
      const __m256i l0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 64 * half));
      const __m256i l1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 64 * half + 32));
      const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 128 + 32 * half));
      const __m256i c0 = _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_and_si256(_mm256_slli_epi16(h, 4), m2));
      const __m256i c1 = _mm256_or_si256(_mm256_and_si256(l1, m4), _mm256_and_si256(_mm256_slli_epi16(h, 2), m2));
      const __m256i c2 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4), _mm256_and_si256(h, m2));
      const __m256i c3 =
          _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4), _mm256_and_si256(_mm256_srli_epi16(h, 2), m2));
      // 8 int8 scales -> two float quads [s0..s3], [s4..s7]
      const __m128i s8 = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + 192 + 8 * half));
      const __m128 s03 = _mm_mul_ps(d, _mm_cvtepi32_ps(_mm_cvtepi8_epi32(s8)));
      const __m128 s47 = _mm_mul_ps(d, _mm_cvtepi32_ps(_mm_cvtepi8_epi32(_mm_srli_si128(s8, 4))));
      const __m128 m32 = _mm_set1_ps(-32.0f);
      e.template pair<0>(join(c0, c1), s03, _mm_mul_ps(m32, s03));
      e.template pair<1>(join(c2, c3), s47, _mm_mul_ps(m32, s47));
    }
  }
};

template <class F, int NT>
struct PairEmit {
  __m512 acc[2][NT];
  __m128 sb[NT];
  const int8_t* xq[NT];
  const float* xd[NT];
  const float* xs[NT];
  const float* x8[NT];
  int64_t u = 0;  // index of the first unit of the next pair

  template <int P>
  inline void pair(__m512i c, __m128 a4, __m128 b4) {
    if constexpr (F::kSigned) {
      c = _mm512_xor_si512(c, _mm512_set1_epi8(static_cast<char>(0x80)));  // u8 operand: c + 128
      b4 = _mm_fnmadd_ps(_mm_set1_ps(128.0f), a4, b4);
    }
    // weight scales spread to the 16 int32 lanes (4 lanes = one half unit), shared by all tokens
    const __m512 a16 = _mm512_permutexvar_ps(_mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3),
                                             _mm512_castps128_ps512(a4));
    for (int t = 0; t < NT; ++t) {
      const __m512i x = _mm512_loadu_si512(xq[t] + 32 * u);
      const __m512 p = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(_mm512_setzero_si512(), c, x));
      const __m512 s = _mm512_mul_ps(a16, _mm512_loadu_ps(x8[t] + 8 * u));  // [dx_u x8, dx_u+1 x8]
      acc[P][t] = _mm512_fmadd_ps(p, s, acc[P][t]);
      sb[t] = _mm_fmadd_ps(b4, _mm_loadu_ps(xs[t] + 2 * u), sb[t]);
    }
    u += 2;
  }
};

// The single-unit (256-bit) emitter for a leftover odd block, sharing the pair emitter's state.
template <class F, int NT>
struct TailEmit {
  PairEmit<F, NT>& e;
  template <int P>
  inline void unit(__m256i c, float alo, float ahi, float blo, float bhi) {
    if constexpr (F::kSigned) {
      c = _mm256_xor_si256(c, _mm256_set1_epi8(static_cast<char>(0x80)));
      blo -= 128.0f * alo, bhi -= 128.0f * ahi;
    }
    for (int t = 0; t < NT; ++t) {
      const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(e.xq[t] + 32 * e.u));
      const __m256 p = _mm256_cvtepi32_ps(_mm256_dpbusd_epi32(_mm256_setzero_si256(), c, x));
      const float dx = e.xd[t][e.u];
      const __m256 s = _mm256_setr_m128(_mm_set1_ps(alo * dx), _mm_set1_ps(ahi * dx));
      e.acc[0][t] = _mm512_add_ps(e.acc[0][t], _mm512_zextps256_ps512(_mm256_mul_ps(p, s)));
      e.sb[t] = _mm_add_ps(e.sb[t], _mm_set_ss(blo * e.xs[t][2 * e.u] + bhi * e.xs[t][2 * e.u + 1]));
    }
    ++e.u;
  }
};

constexpr int kPrefetch = 2048;  // bytes ahead of the current block

template <class F, int NT>
inline void pair_tile(const uint8_t* row, const Q8View& x, int64_t t0, float* y, int64_t ldy) {
  using S = typename F::Single;
  const int64_t cols = x.cols;
  PairEmit<F, NT> e;
  for (int t = 0; t < NT; ++t) {
    e.acc[0][t] = e.acc[1][t] = _mm512_setzero_ps();
    e.sb[t] = _mm_setzero_ps();
    e.xq[t] = x.q + (t0 + t) * cols;
    e.xd[t] = x.d + (t0 + t) * (cols / 32);
    e.xs[t] = x.s16 + (t0 + t) * (cols / 16);
    e.x8[t] = x.d8 + (t0 + t) * (cols / 4);
  }
  const RowCtx ctx = row_ctx<S>(row);
  const uint8_t* p = row + S::kHeader;
  const int64_t nb = cols / S::kBlockElems;
  int64_t b = 0;
  if constexpr (S::kUnits == 1) {
    for (; b + 4 <= nb; b += 4, p += 4 * S::kBlockBytes) {
      // Streaming a matrix larger than the caches: ask for lines well ahead of the decoder.
      _mm_prefetch(reinterpret_cast<const char*>(p) + kPrefetch, _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(p) + kPrefetch + 64, _MM_HINT_T0);
      F::quad(p, ctx, e);
    }
    if (b + 2 <= nb) {
      F::template pair<0>(p, ctx, e);
      b += 2, p += 2 * S::kBlockBytes;
    }
    if (b < nb) {
      // one odd block: the 256-bit decoder, added into the low half of accumulator set 0
      TailEmit<F, NT> te{e};
      S::template block<0>(p, ctx, te);
    }
  } else {
    for (; b < nb; ++b, p += S::kBlockBytes) {
      for (int l = 0; l < S::kBlockBytes; l += 64) _mm_prefetch(reinterpret_cast<const char*>(p) + kPrefetch + l, _MM_HINT_T0);
      F::template superblock<0>(p, e);
    }
  }
  for (int t = 0; t < NT; ++t)
    y[(t0 + t) * ldy] = _mm512_reduce_add_ps(_mm512_add_ps(e.acc[0][t], e.acc[1][t])) + hsum4(e.sb[t]);
}

template <class F>
void gemm_q8_512(const RowsView& w, int64_t r0, int64_t r1, const Q8View& x, int64_t t0, int64_t t1, float* y,
                 int64_t ldy) {
  for (int64_t t = t0; t < t1; t += 4) {
    const int64_t nt = t1 - t < 4 ? t1 - t : 4;
    for (int64_t r = r0; r < r1; ++r) {
      const uint8_t* row = w.row(r);
      float* yr = y + (r - r0);
      switch (nt) {
        case 1: pair_tile<F, 1>(row, x, t, yr, ldy); break;
        case 2: pair_tile<F, 2>(row, x, t, yr, ldy); break;
        case 3: pair_tile<F, 3>(row, x, t, yr, ldy); break;
        default: pair_tile<F, 4>(row, x, t, yr, ldy); break;
      }
    }
  }
}

}  // namespace
}  // namespace ef::x86
