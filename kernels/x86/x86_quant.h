// Quantized formats on x86, written once and instantiated per ISA level with a "core" policy
// that supplies the int8 dot product (AVX2 maddubs, or AVX-512 VNNI dpbusd).
//
// Each format decodes a block into 32-element units and hands each unit to an emitter:
//   emit.unit<P>(c, a_lo, a_hi, b_lo, b_hi)   with  w[k] = a_h * c[k] + b_h,  h = k / 16
// where c is 32 codes in a __m256i (unsigned, or signed when F::kSigned). The dot product with
// Q8 activations (codes q, scale dx) is then
//   sum_h (a_h * dx * sum_{k in h} c[k] q[k]) + b_h * s16_h          (s16_h = dx * sum q over h).
// P (0/1) picks one of two accumulator sets so consecutive units do not wait on each other.
#pragma once

#include "x86_common.h"
#include "kernel_table.h"

namespace ef::x86 {
namespace {

inline __m256i nibbles16(const uint8_t* p) {  // 16 bytes -> low nibbles (elements 0-15), high (16-31)
  const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  const __m128i m = _mm_set1_epi8(0x0F);
  return combine(_mm_and_si128(q, m), _mm_and_si128(_mm_srli_epi16(q, 4), m));
}

// Spread 32 bits to 32 bytes: byte k = 0xFF if bit k is set.
inline __m256i bits_to_bytes(uint32_t bits) {
  const __m256i shuf = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3,
                                        3, 3, 3, 3, 3);
  __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(bits)), shuf);
  const __m256i bit = _mm256_set1_epi64x(0x8040201008040201LL);
  return _mm256_cmpeq_epi8(_mm256_and_si256(v, bit), bit);
}

struct RowCtx {
  __m256i lut;  // q4_lut levels, both lanes
  float scale;
};

struct Q8_0 {
  static constexpr int kBlockElems = 32, kBlockBytes = 34, kHeader = 0, kUnits = 1;
  static constexpr bool kSigned = true, kSplit = false, kHasB = false;
  template <int P, class E>
  static inline void block(const uint8_t* p, const RowCtx&, E& e) {
    const float d = h2f(p);
    e.template unit<P>(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 2)), d, d, 0.0f, 0.0f);
  }
};

struct Q4_0 {
  static constexpr int kBlockElems = 32, kBlockBytes = 18, kHeader = 0, kUnits = 1;
  static constexpr bool kSigned = false, kSplit = false, kHasB = true;
  template <int P, class E>
  static inline void block(const uint8_t* p, const RowCtx&, E& e) {
    const float d = h2f(p);
    e.template unit<P>(nibbles16(p + 2), d, d, -8.0f * d, -8.0f * d);
  }
};

struct Q4_1 {
  static constexpr int kBlockElems = 32, kBlockBytes = 20, kHeader = 0, kUnits = 1;
  static constexpr bool kSigned = false, kSplit = false, kHasB = true;
  template <int P, class E>
  static inline void block(const uint8_t* p, const RowCtx&, E& e) {
    const float d = h2f(p), m = h2f(p + 2);
    e.template unit<P>(nibbles16(p + 4), d, d, m, m);
  }
};

struct Q5_0 {
  static constexpr int kBlockElems = 32, kBlockBytes = 22, kHeader = 0, kUnits = 1;
  static constexpr bool kSigned = false, kSplit = false, kHasB = true;
  template <int P, class E>
  static inline void block(const uint8_t* p, const RowCtx&, E& e) {
    const float d = h2f(p);
    uint32_t qh;
    std::memcpy(&qh, p + 2, 4);
    const __m256i hi = _mm256_and_si256(bits_to_bytes(qh), _mm256_set1_epi8(0x10));
    e.template unit<P>(_mm256_or_si256(nibbles16(p + 6), hi), d, d, -16.0f * d, -16.0f * d);
  }
};

struct Q4_K {
  static constexpr int kBlockElems = 256, kBlockBytes = 144, kHeader = 0, kUnits = 8;
  static constexpr bool kSigned = false, kSplit = false, kHasB = true;
  template <int P, class E>
  static inline void block(const uint8_t* p, const RowCtx&, E& e) {
    const float d = h2f(p), dmin = h2f(p + 2);
    const uint8_t* s = p + 4;
    float a[8], b[8];
    for (int j = 0; j < 4; ++j) {
      a[j] = d * static_cast<float>(s[j] & 63);
      b[j] = -(dmin * static_cast<float>(s[j + 4] & 63));
      a[j + 4] = d * static_cast<float>((s[j + 8] & 0xF) | ((s[j] >> 6) << 4));
      b[j + 4] = -(dmin * static_cast<float>((s[j + 8] >> 4) | ((s[j + 4] >> 6) << 4)));
    }
    const __m256i m = _mm256_set1_epi8(0x0F);
    for (int k = 0; k < 4; ++k) {
      const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 16 + 32 * k));
      e.template unit<0>(_mm256_and_si256(q, m), a[2 * k], a[2 * k], b[2 * k], b[2 * k]);
      e.template unit<1>(_mm256_and_si256(_mm256_srli_epi16(q, 4), m), a[2 * k + 1], a[2 * k + 1], b[2 * k + 1],
                         b[2 * k + 1]);
    }
  }
};

struct Q6_K {
  static constexpr int kBlockElems = 256, kBlockBytes = 210, kHeader = 0, kUnits = 8;
  static constexpr bool kSigned = false, kSplit = true, kHasB = true;
  template <int P, class E>
  static inline void block(const uint8_t* p, const RowCtx&, E& e) {
    const int8_t* sc = reinterpret_cast<const int8_t*>(p + 192);
    const float d = h2f(p + 208);
    const __m256i m4 = _mm256_set1_epi8(0x0F), m2 = _mm256_set1_epi8(0x30);
    for (int half = 0; half < 2; ++half) {
      const __m256i l0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 64 * half));
      const __m256i l1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 64 * half + 32));
      const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 128 + 32 * half));
      const int8_t* s = sc + 8 * half;
      // element bits 4-5 come from qh bits 2v..2v+1, moved to bit 4 by the shift
      const __m256i c0 = _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_and_si256(_mm256_slli_epi16(h, 4), m2));
      const __m256i c1 = _mm256_or_si256(_mm256_and_si256(l1, m4), _mm256_and_si256(_mm256_slli_epi16(h, 2), m2));
      const __m256i c2 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4), _mm256_and_si256(h, m2));
      const __m256i c3 =
          _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4), _mm256_and_si256(_mm256_srli_epi16(h, 2), m2));
      const float a0 = d * s[0], a1 = d * s[1], a2 = d * s[2], a3 = d * s[3];
      const float a4 = d * s[4], a5 = d * s[5], a6 = d * s[6], a7 = d * s[7];
      e.template unit<0>(c0, a0, a1, -32.0f * a0, -32.0f * a1);
      e.template unit<1>(c1, a2, a3, -32.0f * a2, -32.0f * a3);
      e.template unit<0>(c2, a4, a5, -32.0f * a4, -32.0f * a5);
      e.template unit<1>(c3, a6, a7, -32.0f * a6, -32.0f * a7);
    }
  }
};

// q3_k super-block (110 bytes): hmask[32], qs[64], 12 bytes of 6-bit scales, d (fp16). Unit j of
// half h takes the 2-bit fields j of qs bytes 32h..32h+31 and bit 4h + j of hmask as code bit 2
// (codes 0..7, offset 4); its two 16-element halves have scales 8h + 2j and 8h + 2j + 1.
struct Q3_K {
  static constexpr int kBlockElems = 256, kBlockBytes = 110, kHeader = 0, kUnits = 8;
  static constexpr bool kSigned = false, kSplit = true, kHasB = true;
  template <int J, class E>
  static inline void unit(__m256i q, __m256i hm, int half, const float* a, E& e) {
    const __m256i low = _mm256_and_si256(_mm256_srli_epi16(q, 2 * J), _mm256_set1_epi8(3));
    const int s = 4 * half + J - 2;  // hmask bit 4h + J moved to bit 2 (16-bit shifts: no byte mixes in)
    const __m256i hb = s >= 0 ? _mm256_srli_epi16(hm, s) : _mm256_slli_epi16(hm, -s);
    const __m256i c = _mm256_or_si256(low, _mm256_and_si256(hb, _mm256_set1_epi8(4)));
    const float alo = a[8 * half + 2 * J], ahi = a[8 * half + 2 * J + 1];
    e.template unit<J & 1>(c, alo, ahi, -4.0f * alo, -4.0f * ahi);
  }
  template <int P, class E>
  static inline void block(const uint8_t* p, const RowCtx&, E& e) {
    const float d = h2f(p + 108);
    int8_t sc[16];
    unpack_q3_k_scales(p + 96, sc);
    float a[16];
    for (int k = 0; k < 16; ++k) a[k] = d * static_cast<float>(sc[k]);
    const __m256i hm = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    for (int half = 0; half < 2; ++half) {
      const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 32 + 32 * half));
      unit<0>(q, hm, half, a, e);
      unit<1>(q, hm, half, a, e);
      unit<2>(q, hm, half, a, e);
      unit<3>(q, hm, half, a, e);
    }
  }
};

// Row header: f32 scale, 16 int8 levels; block: scale code k (value scale = scale * k^2), 16 bytes.
struct Q4_LUT {
  static constexpr int kBlockElems = 32, kBlockBytes = kQ4LutBlockBytes, kHeader = kQ4LutHeaderBytes, kUnits = 1;
  static constexpr bool kSigned = true, kSplit = false, kHasB = false;
  static inline RowCtx row(const uint8_t* r) {
    RowCtx c;
    std::memcpy(&c.scale, r, 4);
    c.lut = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(r + 4)));
    return c;
  }
  template <int P, class E>
  static inline void block(const uint8_t* p, const RowCtx& ctx, E& e) {
    const float k = static_cast<float>(p[0]), d = ctx.scale * (k * k);
    e.template unit<P>(_mm256_shuffle_epi8(ctx.lut, nibbles16(p + 1)), d, d, 0.0f, 0.0f);
  }
};

template <class F>
inline RowCtx row_ctx(const uint8_t* row) {
  if constexpr (F::kHeader > 0) {
    return F::row(row);
  } else {
    return RowCtx{};
  }
}

// Walks the blocks of one row, alternating accumulator sets between consecutive 1-unit blocks.
template <class F, class E>
inline void for_each_block(const uint8_t* row, int64_t cols, E& e) {
  const RowCtx ctx = row_ctx<F>(row);
  const uint8_t* p = row + F::kHeader;
  const int64_t nb = cols / F::kBlockElems;
  int64_t b = 0;
  if constexpr (F::kUnits == 1) {
    for (; b + 2 <= nb; b += 2, p += 2 * F::kBlockBytes) {
      F::template block<0>(p, ctx, e);
      F::template block<1>(p + F::kBlockBytes, ctx, e);
    }
  }
  for (; b < nb; ++b, p += F::kBlockBytes) F::template block<0>(p, ctx, e);
}

// ---- GEMM on Q8 activations: one row against NT tokens.
template <class Core, class F, int NT>
struct GemmEmit {
  __m256 acc[2][NT];
  float sb[NT];
  const int8_t* xq[NT];
  const float* xd[NT];
  const float* xs[NT];
  int64_t u = 0;

  template <int P>
  inline void unit(__m256i c, float alo, float ahi, float blo, float bhi) {
    if constexpr (F::kSigned && Core::kUnsignedOnly) {
      // The u8 x s8 instruction needs unsigned codes: c + 128, corrected through the sums.
      c = _mm256_xor_si256(c, _mm256_set1_epi8(static_cast<char>(0x80)));
      blo -= 128.0f * alo;
      bhi -= 128.0f * ahi;
    }
    for (int t = 0; t < NT; ++t) {
      const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq[t] + 32 * u));
      const __m256 p = _mm256_cvtepi32_ps(Core::template dot<F::kSigned && !Core::kUnsignedOnly>(c, x));
      const float dx = xd[t][u];
      __m256 s;
      if constexpr (F::kSplit) {
        s = _mm256_setr_m128(_mm_set1_ps(alo * dx), _mm_set1_ps(ahi * dx));
      } else {
        s = _mm256_set1_ps(alo * dx);
      }
      acc[P][t] = _mm256_fmadd_ps(p, s, acc[P][t]);
      if constexpr (F::kHasB || (F::kSigned && Core::kUnsignedOnly)) {
        if constexpr (F::kSplit) {
          sb[t] += blo * xs[t][2 * u] + bhi * xs[t][2 * u + 1];
        } else {
          sb[t] += blo * (xs[t][2 * u] + xs[t][2 * u + 1]);
        }
      }
    }
    ++u;
  }
};

template <class Core, class F, int NT>
inline void gemm_tile(const uint8_t* row, const Q8View& x, int64_t t0, float* y, int64_t ldy) {
  const int64_t cols = x.cols;
  GemmEmit<Core, F, NT> e;
  for (int t = 0; t < NT; ++t) {
    e.acc[0][t] = _mm256_setzero_ps();
    e.acc[1][t] = _mm256_setzero_ps();
    e.sb[t] = 0.0f;
    e.xq[t] = x.q + (t0 + t) * cols;
    e.xd[t] = x.d + (t0 + t) * (cols / 32);
    e.xs[t] = x.s16 + (t0 + t) * (cols / 16);
  }
  for_each_block<F>(row, cols, e);
  for (int t = 0; t < NT; ++t) y[(t0 + t) * ldy] = hsum(_mm256_add_ps(e.acc[0][t], e.acc[1][t])) + e.sb[t];
}

template <class Core, class F>
void gemm_q8(const RowsView& w, int64_t r0, int64_t r1, const Q8View& x, int64_t t0, int64_t t1, float* y,
             int64_t ldy) {
  for (int64_t t = t0; t < t1; t += 4) {
    const int64_t nt = t1 - t < 4 ? t1 - t : 4;
    for (int64_t r = r0; r < r1; ++r) {
      const uint8_t* row = w.row(r);
      float* yr = y + (r - r0);
      switch (nt) {
        case 1: gemm_tile<Core, F, 1>(row, x, t, yr, ldy); break;
        case 2: gemm_tile<Core, F, 2>(row, x, t, yr, ldy); break;
        case 3: gemm_tile<Core, F, 3>(row, x, t, yr, ldy); break;
        default: gemm_tile<Core, F, 4>(row, x, t, yr, ldy); break;
      }
    }
  }
}

// ---- Dequantization of one row to f32 (same decoders).
template <class F>
struct DequantEmit {
  float* out;
  template <int P>
  inline void unit(__m256i c, float alo, float ahi, float blo, float bhi) {
    const __m128i c0 = _mm256_castsi256_si128(c), c1 = _mm256_extracti128_si256(c, 1);
    const __m128i parts[4] = {c0, _mm_srli_si128(c0, 8), c1, _mm_srli_si128(c1, 8)};
    for (int k = 0; k < 4; ++k) {
      const __m256i v = F::kSigned ? _mm256_cvtepi8_epi32(parts[k]) : _mm256_cvtepu8_epi32(parts[k]);
      const float a = k < 2 ? alo : ahi, b = k < 2 ? blo : bhi;
      _mm256_storeu_ps(out + 8 * k, _mm256_fmadd_ps(_mm256_cvtepi32_ps(v), _mm256_set1_ps(a), _mm256_set1_ps(b)));
    }
    out += 32;
  }
};

template <class F>
void dequant(const uint8_t* row, int64_t cols, float* out) {
  DequantEmit<F> e{out};
  for_each_block<F>(row, cols, e);
}

// ---- Sparse-FFN down step: decode each unit once, add h * w into every token's output.
template <class F>
struct DownEmit {
  float* out;        // [n_tok, dm]
  float* bsum;       // [n_tok, dm / 16]: offsets gathered per half, added at the end
  const float* h;    // h[t * cnt]
  int64_t cnt, n_tok, dm;
  int64_t u = 0;
  template <int P>
  inline void unit(__m256i c, float alo, float ahi, float blo, float bhi) {
    const __m128i c0 = _mm256_castsi256_si128(c), c1 = _mm256_extracti128_si256(c, 1);
    const __m128i parts[4] = {c0, _mm_srli_si128(c0, 8), c1, _mm_srli_si128(c1, 8)};
    __m256 cf[4];
    for (int k = 0; k < 4; ++k)
      cf[k] = _mm256_cvtepi32_ps(F::kSigned ? _mm256_cvtepi8_epi32(parts[k]) : _mm256_cvtepu8_epi32(parts[k]));
    for (int64_t t = 0; t < n_tok; ++t) {
      const float hv = h[t * cnt];
      if (hv == 0.0f) continue;
      float* o = out + t * dm + 32 * u;
      const __m256 hl = _mm256_set1_ps(hv * alo), hh = _mm256_set1_ps(hv * ahi);
      _mm256_storeu_ps(o, _mm256_fmadd_ps(cf[0], hl, _mm256_loadu_ps(o)));
      _mm256_storeu_ps(o + 8, _mm256_fmadd_ps(cf[1], hl, _mm256_loadu_ps(o + 8)));
      _mm256_storeu_ps(o + 16, _mm256_fmadd_ps(cf[2], hh, _mm256_loadu_ps(o + 16)));
      _mm256_storeu_ps(o + 24, _mm256_fmadd_ps(cf[3], hh, _mm256_loadu_ps(o + 24)));
      if constexpr (F::kHasB) {
        bsum[t * (dm / 16) + 2 * u] += hv * blo;
        bsum[t * (dm / 16) + 2 * u + 1] += hv * bhi;
      }
    }
    ++u;
  }
};

template <class F>
void ffn_down(const uint8_t* const* rows, const float* h, int64_t cnt, int64_t n_tok, int64_t dm, float* out,
              float* scratch) {
  if constexpr (F::kHasB) {
    for (int64_t k = 0; k < n_tok * dm / 16; ++k) scratch[k] = 0.0f;
  }
  for (int64_t i = 0; i < cnt; ++i) {
    DownEmit<F> e{out, scratch, h + i, cnt, n_tok, dm};
    for_each_block<F>(rows[i], dm, e);
  }
  if constexpr (F::kHasB) {
    for (int64_t t = 0; t < n_tok; ++t)
      for (int64_t k = 0; k < dm / 16; ++k) {
        const __m256 b = _mm256_set1_ps(scratch[t * (dm / 16) + k]);
        float* o = out + t * dm + 16 * k;
        _mm256_storeu_ps(o, _mm256_add_ps(b, _mm256_loadu_ps(o)));
        _mm256_storeu_ps(o + 8, _mm256_add_ps(b, _mm256_loadu_ps(o + 8)));
      }
  }
}

}  // namespace
}  // namespace ef::x86
