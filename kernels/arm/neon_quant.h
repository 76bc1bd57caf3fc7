// Quantized formats on aarch64, instantiated per level with a "core" for the int8 dot product
// (sdot with dotprod, smull/smlal + pairwise add without). Same unit model as x86_quant.h:
//   emit.unit<P>(c0, c1, a_lo, a_hi, b_lo, b_hi)    w[k] = a_h * c[k] + b_h
// with c0 = codes of elements 0-15 and c1 = codes 16-31, all as int8 (every code fits).
#pragma once

#include "kernel_table.h"
#include "neon_common.h"

namespace ef::arm {
namespace {

struct RowCtx {
  int8x16_t lut;
  float scale;
};

inline uint8x16_t bits16_to_bytes(uint32_t bits16) {  // byte k = 0xFF if bit k set (k < 16)
  const uint8x16_t v = vcombine_u8(vdup_n_u8(static_cast<uint8_t>(bits16)), vdup_n_u8(static_cast<uint8_t>(bits16 >> 8)));
  const uint8x16_t bit = {1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128};
  return vtstq_u8(v, bit);
}

struct Q8_0 {
  static constexpr int kBlockElems = 32, kBlockBytes = 34, kHeader = 0, kUnits = 1;
  static constexpr bool kSigned = true, kSplit = false, kHasB = false;
  template <int P, class E>
  static inline void block(const uint8_t* p, const RowCtx&, E& e) {
    const float d = h2f(p);
    const int8_t* q = reinterpret_cast<const int8_t*>(p + 2);
    e.template unit<P>(vld1q_s8(q), vld1q_s8(q + 16), d, d, 0.0f, 0.0f);
  }
};

struct Q4_0 {
  static constexpr int kBlockElems = 32, kBlockBytes = 18, kHeader = 0, kUnits = 1;
  static constexpr bool kSigned = false, kSplit = false, kHasB = true;
  template <int P, class E>
  static inline void block(const uint8_t* p, const RowCtx&, E& e) {
    const float d = h2f(p);
    const uint8x16_t q = vld1q_u8(p + 2);
    e.template unit<P>(vreinterpretq_s8_u8(vandq_u8(q, vdupq_n_u8(15))), vreinterpretq_s8_u8(vshrq_n_u8(q, 4)), d, d,
                       -8.0f * d, -8.0f * d);
  }
};

struct Q4_1 {
  static constexpr int kBlockElems = 32, kBlockBytes = 20, kHeader = 0, kUnits = 1;
  static constexpr bool kSigned = false, kSplit = false, kHasB = true;
  template <int P, class E>
  static inline void block(const uint8_t* p, const RowCtx&, E& e) {
    const float d = h2f(p), m = h2f(p + 2);
    const uint8x16_t q = vld1q_u8(p + 4);
    e.template unit<P>(vreinterpretq_s8_u8(vandq_u8(q, vdupq_n_u8(15))), vreinterpretq_s8_u8(vshrq_n_u8(q, 4)), d, d, m, m);
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
    const uint8x16_t q = vld1q_u8(p + 6), b16 = vdupq_n_u8(16);
    const uint8x16_t lo = vorrq_u8(vandq_u8(q, vdupq_n_u8(15)), vandq_u8(bits16_to_bytes(qh & 0xFFFF), b16));
    const uint8x16_t hi = vorrq_u8(vshrq_n_u8(q, 4), vandq_u8(bits16_to_bytes(qh >> 16), b16));
    e.template unit<P>(vreinterpretq_s8_u8(lo), vreinterpretq_s8_u8(hi), d, d, -16.0f * d, -16.0f * d);
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
    const uint8x16_t m = vdupq_n_u8(15);
    for (int k = 0; k < 4; ++k) {
      const uint8x16_t q0 = vld1q_u8(p + 16 + 32 * k), q1 = vld1q_u8(p + 32 + 32 * k);
      e.template unit<0>(vreinterpretq_s8_u8(vandq_u8(q0, m)), vreinterpretq_s8_u8(vandq_u8(q1, m)), a[2 * k], a[2 * k],
                         b[2 * k], b[2 * k]);
      e.template unit<1>(vreinterpretq_s8_u8(vshrq_n_u8(q0, 4)), vreinterpretq_s8_u8(vshrq_n_u8(q1, 4)), a[2 * k + 1],
                         a[2 * k + 1], b[2 * k + 1], b[2 * k + 1]);
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
    const uint8x16_t m4 = vdupq_n_u8(15), m2 = vdupq_n_u8(3);
    for (int half = 0; half < 2; ++half) {
      const uint8_t* ql = p + 64 * half;
      const uint8_t* qh = p + 128 + 32 * half;
      const uint8x16_t l0a = vld1q_u8(ql), l0b = vld1q_u8(ql + 16), l1a = vld1q_u8(ql + 32), l1b = vld1q_u8(ql + 48);
      const uint8x16_t ha = vld1q_u8(qh), hb = vld1q_u8(qh + 16);
      const int8_t* s = sc + 8 * half;
      auto code = [&](uint8x16_t lo, uint8x16_t h, int shift) {
        const uint8x16_t hi2 = vandq_u8(vshlq_u8(h, vdupq_n_s8(static_cast<int8_t>(-shift))), m2);
        return vreinterpretq_s8_u8(vorrq_u8(lo, vshlq_n_u8(hi2, 4)));
      };
      float a[8];
      for (int k = 0; k < 8; ++k) a[k] = d * s[k];
      e.template unit<0>(code(vandq_u8(l0a, m4), ha, 0), code(vandq_u8(l0b, m4), hb, 0), a[0], a[1], -32.0f * a[0], -32.0f * a[1]);
      e.template unit<1>(code(vandq_u8(l1a, m4), ha, 2), code(vandq_u8(l1b, m4), hb, 2), a[2], a[3], -32.0f * a[2], -32.0f * a[3]);
      e.template unit<0>(code(vshrq_n_u8(l0a, 4), ha, 4), code(vshrq_n_u8(l0b, 4), hb, 4), a[4], a[5], -32.0f * a[4], -32.0f * a[5]);
      e.template unit<1>(code(vshrq_n_u8(l1a, 4), ha, 6), code(vshrq_n_u8(l1b, 4), hb, 6), a[6], a[7], -32.0f * a[6], -32.0f * a[7]);
    }
  }
};

// q3_k super-block (110 bytes): hmask[32], qs[64], 12 bytes of 6-bit scales, d (fp16). Unit j of
// half h takes the 2-bit fields j of qs bytes 32h..32h+31 and bit 4h + j of hmask as code bit 2
// (codes 0..7, offset 4); its two 16-element halves have scales 8h + 2j and 8h + 2j + 1.
struct Q3_K {
  static constexpr int kBlockElems = 256, kBlockBytes = 110, kHeader = 0, kUnits = 8;
  static constexpr bool kSigned = false, kSplit = true, kHasB = true;
  static inline int8x16_t code(uint8x16_t q, uint8x16_t hm, int j, int half) {
    const uint8x16_t low = vandq_u8(vshlq_u8(q, vdupq_n_s8(static_cast<int8_t>(-2 * j))), vdupq_n_u8(3));
    // per-byte shift: hmask bit 4h + j to bit 2 (left when negative distance)
    const uint8x16_t hb = vshlq_u8(hm, vdupq_n_s8(static_cast<int8_t>(2 - 4 * half - j)));
    return vreinterpretq_s8_u8(vorrq_u8(low, vandq_u8(hb, vdupq_n_u8(4))));
  }
  template <int J, class E>
  static inline void unit(const uint8_t* p, int half, const float* a, E& e) {
    const uint8x16_t q0 = vld1q_u8(p + 32 + 32 * half), q1 = vld1q_u8(p + 48 + 32 * half);
    const uint8x16_t h0 = vld1q_u8(p), h1 = vld1q_u8(p + 16);
    const float alo = a[8 * half + 2 * J], ahi = a[8 * half + 2 * J + 1];
    e.template unit<J & 1>(code(q0, h0, J, half), code(q1, h1, J, half), alo, ahi, -4.0f * alo, -4.0f * ahi);
  }
  template <int P, class E>
  static inline void block(const uint8_t* p, const RowCtx&, E& e) {
    const float d = h2f(p + 108);
    int8_t sc[16];
    unpack_q3_k_scales(p + 96, sc);
    float a[16];
    for (int k = 0; k < 16; ++k) a[k] = d * static_cast<float>(sc[k]);
    for (int half = 0; half < 2; ++half) {
      unit<0>(p, half, a, e);
      unit<1>(p, half, a, e);
      unit<2>(p, half, a, e);
      unit<3>(p, half, a, e);
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
    c.lut = vld1q_s8(reinterpret_cast<const int8_t*>(r + 4));
    return c;
  }
  template <int P, class E>
  static inline void block(const uint8_t* p, const RowCtx& ctx, E& e) {
    const uint8x16_t q = vld1q_u8(p + 1);
    const float k = static_cast<float>(p[0]), d = ctx.scale * (k * k);
    e.template unit<P>(vqtbl1q_s8(ctx.lut, vandq_u8(q, vdupq_n_u8(15))), vqtbl1q_s8(ctx.lut, vshrq_n_u8(q, 4)), d, d,
                       0.0f, 0.0f);
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

template <class Core, class F, int NT>
struct GemmEmit {
  float32x4_t acc[2][NT];
  float sb[NT];
  const int8_t* xq[NT];
  const float* xd[NT];
  const float* xs[NT];
  int64_t u = 0;

  template <int P>
  inline void unit(int8x16_t c0, int8x16_t c1, float alo, float ahi, float blo, float bhi) {
    for (int t = 0; t < NT; ++t) {
      const int8x16_t x0 = vld1q_s8(xq[t] + 32 * u), x1 = vld1q_s8(xq[t] + 32 * u + 16);
      const float dx = xd[t][u];
      if constexpr (F::kSplit) {
        acc[P][t] = vfmaq_n_f32(acc[P][t], vcvtq_f32_s32(Core::dot(c0, x0)), alo * dx);
        acc[P][t] = vfmaq_n_f32(acc[P][t], vcvtq_f32_s32(Core::dot(c1, x1)), ahi * dx);
        sb[t] += blo * xs[t][2 * u] + bhi * xs[t][2 * u + 1];
      } else {
        acc[P][t] = vfmaq_n_f32(acc[P][t], vcvtq_f32_s32(Core::dot2(c0, x0, c1, x1)), alo * dx);
        if constexpr (F::kHasB) sb[t] += blo * (xs[t][2 * u] + xs[t][2 * u + 1]);
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
    e.acc[0][t] = vdupq_n_f32(0.0f);
    e.acc[1][t] = vdupq_n_f32(0.0f);
    e.sb[t] = 0.0f;
    e.xq[t] = x.q + (t0 + t) * cols;
    e.xd[t] = x.d + (t0 + t) * (cols / 32);
    e.xs[t] = x.s16 + (t0 + t) * (cols / 16);
  }
  for_each_block<F>(row, cols, e);
  for (int t = 0; t < NT; ++t) y[(t0 + t) * ldy] = vaddvq_f32(vaddq_f32(e.acc[0][t], e.acc[1][t])) + e.sb[t];
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

template <class F>
struct DequantEmit {
  float* out;
  template <int P>
  inline void unit(int8x16_t c0, int8x16_t c1, float alo, float ahi, float blo, float bhi) {
    const int8x16_t cs[2] = {c0, c1};
    for (int h = 0; h < 2; ++h) {
      const float a = h ? ahi : alo, b = h ? bhi : blo;
      const int16x8_t w0 = vmovl_s8(vget_low_s8(cs[h])), w1 = vmovl_s8(vget_high_s8(cs[h]));
      const int32x4_t i[4] = {vmovl_s16(vget_low_s16(w0)), vmovl_s16(vget_high_s16(w0)), vmovl_s16(vget_low_s16(w1)),
                              vmovl_s16(vget_high_s16(w1))};
      for (int k = 0; k < 4; ++k) vst1q_f32(out + 16 * h + 4 * k, vfmaq_n_f32(vdupq_n_f32(b), vcvtq_f32_s32(i[k]), a));
    }
    out += 32;
  }
};

template <class F>
void dequant(const uint8_t* row, int64_t cols, float* out) {
  DequantEmit<F> e{out};
  for_each_block<F>(row, cols, e);
}

template <class F>
struct DownEmit {
  float* out;
  float* bsum;
  const float* h;
  int64_t cnt, n_tok, dm;
  int64_t u = 0;
  template <int P>
  inline void unit(int8x16_t c0, int8x16_t c1, float alo, float ahi, float blo, float bhi) {
    float32x4_t cf[8];
    const int8x16_t cs[2] = {c0, c1};
    for (int hh = 0; hh < 2; ++hh) {
      const int16x8_t w0 = vmovl_s8(vget_low_s8(cs[hh])), w1 = vmovl_s8(vget_high_s8(cs[hh]));
      cf[4 * hh] = vcvtq_f32_s32(vmovl_s16(vget_low_s16(w0)));
      cf[4 * hh + 1] = vcvtq_f32_s32(vmovl_s16(vget_high_s16(w0)));
      cf[4 * hh + 2] = vcvtq_f32_s32(vmovl_s16(vget_low_s16(w1)));
      cf[4 * hh + 3] = vcvtq_f32_s32(vmovl_s16(vget_high_s16(w1)));
    }
    for (int64_t t = 0; t < n_tok; ++t) {
      const float hv = h[t * cnt];
      if (hv == 0.0f) continue;
      float* o = out + t * dm + 32 * u;
      const float hl = hv * alo, hh = hv * ahi;
      for (int k = 0; k < 8; ++k) vst1q_f32(o + 4 * k, vfmaq_n_f32(vld1q_f32(o + 4 * k), cf[k], k < 4 ? hl : hh));
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
        const float b = scratch[t * (dm / 16) + k];
        float* o = out + t * dm + 16 * k;
        for (int j = 0; j < 4; ++j) vst1q_f32(o + 4 * j, vaddq_f32(vld1q_f32(o + 4 * j), vdupq_n_f32(b)));
      }
  }
}

}  // namespace
}  // namespace ef::arm
