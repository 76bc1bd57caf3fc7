// Quantized GEMM on the panel layout (kernels.h) for aarch64, instantiated per level with a core
// for the lane dot product: sdot by element (dotprod), or smull + pairwise adds (ARMv8.0).
//
// A panel stores each 4-byte word of its 16 rows as one 64-byte vector; a 128-bit register holds
// the word of 4 rows (a "row group": lane i = row 4g + i). So `acc[i] += dot(w word of row i,
// 4 activation codes)` is one sdot with the activation word broadcast from a lane, and a unit (32
// elements) of a row group is 8 such products with no horizontal sums. Each row group of a panel
// is run in turn: the panel's bytes (at most 16 rows x a row) stay in L1 across the 4 groups.
// Per unit, in integers: isum = sum_k c[k] q[k] - o * S (o = the format's code offset, S = the
// activation code sum), then acc = fma(isum, a * dx, acc) and, for q4_1 / q4_k, acc += b * dx * S.
#pragma once

#include <algorithm>

#include "group_tiles.h"
#include "kernel_table.h"
#include "neon_common.h"

namespace ef::arm {
namespace {

constexpr int kPanelRows = 16;
constexpr int kGroupRows = 4;
// Bytes requested ahead of the panel being computed (not tuned on hardware: qemu shows no timing).
constexpr size_t kPanelPrefetch = 16 << 10;

// Row group g of a panel: the 16 bytes of the group in the 64-byte vector of each word.
struct Group {
  const uint8_t* base;  // the panel
  int g;
  const uint8_t* word(size_t off) const { return base + kPanelRows * off + 16 * g; }  // word at row byte off
  uint8x16_t words(size_t off, int j) const { return vld1q_u8(word(off) + 64 * j); }  // j-th word after off
  // The fp16 field at row byte off (a 2-byte lane): the 4 rows' values as floats.
  float32x4_t half(size_t off) const {
    return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(reinterpret_cast<const uint16_t*>(base + kPanelRows * off + 8 * g))));
  }
};

inline int8x16_t s8(uint8x16_t v) { return vreinterpretq_s8_u8(v); }

// Scales of one unit for one row group: a (and a_hi for split formats, b for a float offset).
struct UnitScales {
  float32x4_t a, a_hi, b;
};

// Each format: kBB bytes per (super-)block, kShift = log2 of the code offset (-1: none),
// kFloatBias, kSplit as in avx512_panel.h; unit(G, u, w, sc) decodes unit u of group G into 8
// words of codes w (register j = codes 4j..4j+3 of each row) and its scales.
struct NQ4_0 {
  static constexpr int kBB = 18, kShift = 3;
  static constexpr bool kFloatBias = false, kSplit = false;
  static inline void unit(const Group& G, int64_t u, int8x16_t w[8], UnitScales& sc) {
    const size_t at = static_cast<size_t>(u) * kBB;
    sc.a = G.half(at);
    const uint8x16_t m = vdupq_n_u8(15);
    for (int j = 0; j < 4; ++j) {
      const uint8x16_t q = G.words(at + 2, j);
      w[j] = s8(vandq_u8(q, m));
      w[4 + j] = s8(vshrq_n_u8(q, 4));
    }
  }
};

struct NQ4_1 {
  static constexpr int kBB = 20, kShift = -1;
  static constexpr bool kFloatBias = true, kSplit = false;
  static inline void unit(const Group& G, int64_t u, int8x16_t w[8], UnitScales& sc) {
    const size_t at = static_cast<size_t>(u) * kBB;
    sc.a = G.half(at);
    sc.b = G.half(at + 2);
    const uint8x16_t m = vdupq_n_u8(15);
    for (int j = 0; j < 4; ++j) {
      const uint8x16_t q = G.words(at + 4, j);
      w[j] = s8(vandq_u8(q, m));
      w[4 + j] = s8(vshrq_n_u8(q, 4));
    }
  }
};

struct NQ5_0 {
  static constexpr int kBB = 22, kShift = 4;
  static constexpr bool kFloatBias = false, kSplit = false;
  static inline void unit(const Group& G, int64_t u, int8x16_t w[8], UnitScales& sc) {
    const size_t at = static_cast<size_t>(u) * kBB;
    sc.a = G.half(at);
    const uint8x16_t m = vdupq_n_u8(15), b16 = vdupq_n_u8(16);
    const uint32x4_t qh = vreinterpretq_u32_u8(G.words(at + 2, 0));
    // Element 4j + k takes bit 4j + k of qh: shift the lane right by 4j, copy its low byte to the
    // lane's 4 bytes and test bit k in byte k.
    const uint8x16_t first = {0, 0, 0, 0, 4, 4, 4, 4, 8, 8, 8, 8, 12, 12, 12, 12};
    const uint8x16_t bit = {1, 2, 4, 8, 1, 2, 4, 8, 1, 2, 4, 8, 1, 2, 4, 8};
    for (int j = 0; j < 4; ++j) {
      const uint8x16_t q = G.words(at + 6, j);
      const uint8x16_t lo = vqtbl1q_u8(vreinterpretq_u8_u32(vshlq_u32(qh, vdupq_n_s32(-4 * j))), first);
      const uint8x16_t hi = vqtbl1q_u8(vreinterpretq_u8_u32(vshlq_u32(qh, vdupq_n_s32(-4 * j - 16))), first);
      w[j] = s8(vorrq_u8(vandq_u8(q, m), vandq_u8(vtstq_u8(lo, bit), b16)));
      w[4 + j] = s8(vorrq_u8(vshrq_n_u8(q, 4), vandq_u8(vtstq_u8(hi, bit), b16)));
    }
  }
};

struct NQ8_0 {
  static constexpr int kBB = 34, kShift = -1;  // signed codes: the dot product takes them as they are
  static constexpr bool kFloatBias = false, kSplit = false;
  static inline void unit(const Group& G, int64_t u, int8x16_t w[8], UnitScales& sc) {
    const size_t at = static_cast<size_t>(u) * kBB;
    sc.a = G.half(at);
    for (int j = 0; j < 8; ++j) w[j] = s8(G.words(at + 2, j));
  }
};

// q4_k super-block: word 0 = d | dmin << 16, words 1-3 = the 12 bytes of 6-bit scales and
// minimums, then 4 chunks of 32 bytes (chunk c: unit 2c in the low nibbles, 2c + 1 in the high).
struct NQ4_K {
  static constexpr int kBB = 144, kShift = -1;
  static constexpr bool kFloatBias = true, kSplit = false;
  static inline void unit(const Group& G, int64_t u, int8x16_t w[8], UnitScales& sc) {
    const size_t at = static_cast<size_t>(u / 8) * kBB;
    const int j = static_cast<int>(u % 8);
    const uint32x4_t dd = vreinterpretq_u32_u8(G.words(at, 0));
    const uint32x4_t s0 = vreinterpretq_u32_u8(G.words(at, 1)), s1 = vreinterpretq_u32_u8(G.words(at, 2)),
                     s2 = vreinterpretq_u32_u8(G.words(at, 3));
    const float32x4_t d = vcvt_f32_f16(vreinterpret_f16_u16(vmovn_u32(dd)));
    const float32x4_t dmin = vcvt_f32_f16(vreinterpret_f16_u16(vshrn_n_u32(dd, 16)));
    const uint32x4_t m6 = vdupq_n_u32(63), m4 = vdupq_n_u32(15), m2 = vdupq_n_u32(3);
    uint32x4_t s, mn;
    if (j < 4) {
      s = vandq_u32(vshlq_u32(s0, vdupq_n_s32(-8 * j)), m6);
      mn = vandq_u32(vshlq_u32(s1, vdupq_n_s32(-8 * j)), m6);
    } else {
      const int k = 8 * (j - 4);
      s = vorrq_u32(vandq_u32(vshlq_u32(s2, vdupq_n_s32(-k)), m4),
                    vshlq_n_u32(vandq_u32(vshlq_u32(s0, vdupq_n_s32(-k - 6)), m2), 4));
      mn = vorrq_u32(vandq_u32(vshlq_u32(s2, vdupq_n_s32(-k - 4)), m4),
                     vshlq_n_u32(vandq_u32(vshlq_u32(s1, vdupq_n_s32(-k - 6)), m2), 4));
    }
    sc.a = vmulq_f32(d, vcvtq_f32_u32(s));
    sc.b = vnegq_f32(vmulq_f32(dmin, vcvtq_f32_u32(mn)));
    const uint8x16_t m = vdupq_n_u8(15);
    for (int k = 0; k < 8; ++k) {
      const uint8x16_t q = G.words(at + 16 + 32 * (j / 2), k);
      w[k] = s8(j % 2 ? vshrq_n_u8(q, 4) : vandq_u8(q, m));
    }
  }
};

// q6_k super-block: ql[128], qh[64], 16 int8 scales (one per 16 elements), d. Unit 4h + v of
// half h: low nibbles from ql byte 64h + 32 (v & 1) (high nibble when v >= 2), 2 high bits from
// qh byte 128 + 32h, bits 2v..2v+1.
struct NQ6_K {
  static constexpr int kBB = 210, kShift = 5;
  static constexpr bool kFloatBias = false, kSplit = true;
  static inline void unit(const Group& G, int64_t u, int8x16_t w[8], UnitScales& sc) {
    const size_t at = static_cast<size_t>(u / 8) * kBB;
    const int h = static_cast<int>(u % 8) / 4, v = static_cast<int>(u % 4);
    const float32x4_t d = G.half(at + 208);
    // scales 8h + 2v and 8h + 2v + 1: bytes (2v) % 4 and +1 of scale word 2h + v / 2
    const int32x4_t sw = vreinterpretq_s32_u8(G.words(at + 192, 2 * h + v / 2));
    const int b0 = (2 * v) % 4;
    const int32x4_t lo = vshrq_n_s32(vshlq_s32(sw, vdupq_n_s32(24 - 8 * b0)), 24);
    const int32x4_t hi = vshrq_n_s32(vshlq_s32(sw, vdupq_n_s32(16 - 8 * b0)), 24);
    sc.a = vmulq_f32(d, vcvtq_f32_s32(lo));
    sc.a_hi = vmulq_f32(d, vcvtq_f32_s32(hi));
    const uint8x16_t m4 = vdupq_n_u8(15), m2 = vdupq_n_u8(3);
    const int8x16_t hshift = vdupq_n_s8(static_cast<int8_t>(-2 * v));
    for (int k = 0; k < 8; ++k) {
      const uint8x16_t l = G.words(at + 64 * h + 32 * (v & 1), k);
      const uint8x16_t q = G.words(at + 128 + 32 * h, k);
      const uint8x16_t low = v >= 2 ? vshrq_n_u8(l, 4) : vandq_u8(l, m4);
      w[k] = s8(vorrq_u8(low, vshlq_n_u8(vandq_u8(vshlq_u8(q, hshift), m2), 4)));
    }
  }
};

// q3_k super-block: words 0-7 hmask, 8-23 qs, 24-26 the scale bytes, then d. Unit 4h + j: 2-bit
// fields j of qs bytes 32h.., bit 4h + j of hmask as code bit 2; scales 8h + 2j and 8h + 2j + 1,
// whose low nibbles h are bytes 2j, 2j + 1 of the scale bytes and whose high bit pairs 2h + j / 2
// are bytes 8 + 2 (j % 2), + 1.
struct NQ3_K {
  static constexpr int kBB = 110, kShift = 2;
  static constexpr bool kFloatBias = false, kSplit = true;
  static inline void unit(const Group& G, int64_t u, int8x16_t w[8], UnitScales& sc) {
    const size_t at = static_cast<size_t>(u / 8) * kBB;
    const int h = static_cast<int>(u % 8) / 4, j = static_cast<int>(u % 4);
    const float32x4_t d = G.half(at + 108);
    const uint32x4_t sw = vreinterpretq_u32_u8(G.words(at + 96, j / 2)), hw = vreinterpretq_u32_u8(G.words(at + 96, 2));
    const int b0 = 2 * (j % 2), hs = 2 * (2 * h + j / 2);
    auto scale = [&](int byte) {
      const uint32x4_t lo = vandq_u32(vshlq_u32(sw, vdupq_n_s32(-(8 * byte + 4 * h))), vdupq_n_u32(15));
      const uint32x4_t hi = vandq_u32(vshlq_u32(hw, vdupq_n_s32(-(8 * byte + hs))), vdupq_n_u32(3));
      const int32x4_t v = vsubq_s32(vreinterpretq_s32_u32(vorrq_u32(lo, vshlq_n_u32(hi, 4))), vdupq_n_s32(32));
      return vmulq_f32(d, vcvtq_f32_s32(v));
    };
    sc.a = scale(b0);
    sc.a_hi = scale(b0 + 1);
    const int8x16_t qshift = vdupq_n_s8(static_cast<int8_t>(-2 * j));
    const int8x16_t hshift = vdupq_n_s8(static_cast<int8_t>(2 - 4 * h - j));  // hmask bit 4h + j to bit 2
    const uint8x16_t m3 = vdupq_n_u8(3), b2 = vdupq_n_u8(4);
    for (int k = 0; k < 8; ++k) {
      const uint8x16_t q = G.words(at + 32 + 32 * h, k);
      const uint8x16_t m = G.words(at, k);
      w[k] = s8(vorrq_u8(vandq_u8(vshlq_u8(q, qshift), m3), vandq_u8(vshlq_u8(m, hshift), b2)));
    }
  }
};

// Activation pointers of NT consecutive tokens.
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
inline int32x4_t sum_start(int32_t neg_sum) {
  if constexpr (F::kShift >= 0) {
    return vdupq_n_s32(neg_sum * (1 << F::kShift));
  } else {
    return vdupq_n_s32(0);
  }
}

// acc[i] += sum over words j in [J0, J0 + 4) of dot(w[j] row i, activation word j of xv).
template <class Core, int J0>
inline int32x4_t dot4(int32x4_t acc, const int8x16_t w[8], int8x16_t xv) {
  acc = Core::template lane<0>(acc, w[J0], xv);
  acc = Core::template lane<1>(acc, w[J0 + 1], xv);
  acc = Core::template lane<2>(acc, w[J0 + 2], xv);
  return Core::template lane<3>(acc, w[J0 + 3], xv);
}

// This unit's slice of the next panel, requested while the current one is computed (null: none).
inline void prefetch_slice(const uint8_t* prefetch, int64_t u, size_t slice) {
  if (prefetch)
    for (size_t b = 0; b < slice; b += 64) __builtin_prefetch(prefetch + u * slice + b, 0, 3);
}

// A row group's outputs for one token: all kGroupRows of them, or the first `valid`.
inline void store_group(float32x4_t v, float* out, int valid) {
  if (valid >= kGroupRows) {
    vst1q_f32(out, v);
  } else {
    float tmp[4];
    vst1q_f32(tmp, v);
    for (int i = 0; i < valid; ++i) out[i] = tmp[i];
  }
}

// One row group of a panel against NT tokens.
template <class Core, class F, int NT>
void group_tile(const Group& G, int64_t nu, const Tokens<NT>& tk, float* y, int64_t t0, int64_t ldy, int valid,
                const uint8_t* prefetch, size_t slice) {
  float32x4_t acc[NT];
  for (int t = 0; t < NT; ++t) acc[t] = vdupq_n_f32(0.0f);
  for (int64_t u = 0; u < nu; ++u) {
    prefetch_slice(prefetch, u, slice);
    int8x16_t w[8];
    UnitScales sc;
    F::unit(G, u, w, sc);
    for (int t = 0; t < NT; ++t) {
      const int8x16_t xa = vld1q_s8(tk.q[t] + 32 * u), xb = vld1q_s8(tk.q[t] + 32 * u + 16);
      const float32x4_t dx = vdupq_n_f32(tk.d[t][u]);
      if constexpr (F::kSplit) {
        const int32x4_t lo = dot4<Core, 0>(sum_start<F>(tk.ns[t][2 * u]), w, xa);
        const int32x4_t hi = dot4<Core, 4>(sum_start<F>(tk.ns[t][2 * u + 1]), w, xb);
        acc[t] = vfmaq_f32(acc[t], vcvtq_f32_s32(lo), vmulq_f32(sc.a, dx));
        acc[t] = vfmaq_f32(acc[t], vcvtq_f32_s32(hi), vmulq_f32(sc.a_hi, dx));
      } else {
        const int32x4_t s = dot4<Core, 4>(dot4<Core, 0>(sum_start<F>(tk.ns[t][u]), w, xa), w, xb);
        acc[t] = vfmaq_f32(acc[t], vcvtq_f32_s32(s), vmulq_f32(sc.a, dx));
        if constexpr (F::kFloatBias) acc[t] = vfmaq_f32(acc[t], sc.b, vdupq_n_f32(tk.s32[t][u]));
      }
    }
  }
  for (int t = 0; t < NT; ++t) store_group(acc[t], y + (t0 + t) * ldy + kGroupRows * G.g, valid);
}

template <class Core, class F>
void gemm_panels(const RowsView& w, int64_t r0, int64_t r1, const Q8View& x, int64_t t0, int64_t t1, float* y,
                 int64_t ldy) {
  const int64_t nu = w.cols / 32;
  const auto tile = [&](auto nt, const uint8_t* panel, int g, int64_t t, float* yp, int gv, const uint8_t* pf,
                        size_t slice) {
    constexpr int NT = decltype(nt)::value;
    group_tile<Core, F, NT>(Group{panel, g}, nu, Tokens<NT>(x, t, F::kSplit), yp, t, ldy, gv, pf, slice);
  };
  for_each_group_tile<kGroupRows>(w, r0, r1, t0, t1, kPanelPrefetch, y, tile);
}

}  // namespace
}  // namespace ef::arm
