// NEON + i8mm level (ARMv8.6 / v8.2 with FEAT_I8MM, e.g. Cortex-A510/A710/X2 and later): the
// quantized GEMM on panels with smmla for token pairs. smmla multiplies a 2 x 8 int8 block by
// another (2 rows x 8 codes against 2 tokens x 8 codes) into a 2 x 2 int32 block: 32 products per
// instruction, twice sdot's 16. In a panel's row group (4 rows, one 4-byte word per lane), zipping
// words 2p and 2p + 1 gives rows 0-1 (and 2-3) as 2 x 8 blocks, so a unit (32 codes) of 4 rows
// and 2 tokens is 8 smmla. A single token (decode, or an odd one left) runs the dotprod kernel.
#include "neon_panel.h"

namespace ef::arm {
namespace {

struct DotCore {
  template <int L>
  static inline int32x4_t lane(int32x4_t acc, int8x16_t w, int8x16_t x) {
    return vdotq_laneq_s32(acc, w, x, L);
  }
};

template <class F>
inline int32_t start(int32_t neg_sum) {  // sum_start's value as a scalar
  if constexpr (F::kShift >= 0) {
    return neg_sum * (1 << F::kShift);
  } else {
    return 0;
  }
}

inline int8x16_t zip_lo(int8x16_t a, int8x16_t b) {
  return vreinterpretq_s8_s32(vzip1q_s32(vreinterpretq_s32_s8(a), vreinterpretq_s32_s8(b)));
}
inline int8x16_t zip_hi(int8x16_t a, int8x16_t b) {
  return vreinterpretq_s8_s32(vzip2q_s32(vreinterpretq_s32_s8(a), vreinterpretq_s32_s8(b)));
}

// One row group of a panel against NP token pairs. Accumulators hold [row a tok 0, row a tok 1,
// row b tok 0, row b tok 1] for rows (0, 1) and (2, 3) of the group.
template <class F, int NP>
void group_tile_mm(const Group& G, int64_t nu, const Q8View& x, int64_t t0, float* y, int64_t ldy, int valid,
                   const uint8_t* prefetch, size_t slice) {
  const Tokens<2 * NP> tk(x, t0, F::kSplit);
  float32x4_t acc[NP][2];
  for (int k = 0; k < NP; ++k) acc[k][0] = acc[k][1] = vdupq_n_f32(0.0f);
  for (int64_t u = 0; u < nu; ++u) {
    prefetch_slice(prefetch, u, slice);
    int8x16_t w[8];
    UnitScales sc;
    F::unit(G, u, w, sc);
    int8x16_t a01[4], a23[4];  // word pair p (codes 8p..8p+7) of rows 0-1 and 2-3
    for (int p = 0; p < 4; ++p) {
      a01[p] = zip_lo(w[2 * p], w[2 * p + 1]);
      a23[p] = zip_hi(w[2 * p], w[2 * p + 1]);
    }
    const float32x4_t a01s = vzip1q_f32(sc.a, sc.a), a23s = vzip2q_f32(sc.a, sc.a);
    for (int k = 0; k < NP; ++k) {
      const int ta = 2 * k, tb = 2 * k + 1;
      int8x16_t b[4];
      for (int p = 0; p < 4; ++p)
        b[p] = vcombine_s8(vld1_s8(tk.q[ta] + 32 * u + 8 * p), vld1_s8(tk.q[tb] + 32 * u + 8 * p));
      const float32x2_t dd = {tk.d[ta][u], tk.d[tb][u]};
      const float32x4_t dx = vcombine_f32(dd, dd);
      if constexpr (F::kSplit) {
        const int32x2_t lo_s = {start<F>(tk.ns[ta][2 * u]), start<F>(tk.ns[tb][2 * u])};
        const int32x2_t hi_s = {start<F>(tk.ns[ta][2 * u + 1]), start<F>(tk.ns[tb][2 * u + 1])};
        const int32x4_t lo0 = vcombine_s32(lo_s, lo_s), hi0 = vcombine_s32(hi_s, hi_s);
        const int32x4_t lo01 = vmmlaq_s32(vmmlaq_s32(lo0, a01[0], b[0]), a01[1], b[1]);
        const int32x4_t lo23 = vmmlaq_s32(vmmlaq_s32(lo0, a23[0], b[0]), a23[1], b[1]);
        const int32x4_t hi01 = vmmlaq_s32(vmmlaq_s32(hi0, a01[2], b[2]), a01[3], b[3]);
        const int32x4_t hi23 = vmmlaq_s32(vmmlaq_s32(hi0, a23[2], b[2]), a23[3], b[3]);
        const float32x4_t h01s = vzip1q_f32(sc.a_hi, sc.a_hi), h23s = vzip2q_f32(sc.a_hi, sc.a_hi);
        acc[k][0] = vfmaq_f32(acc[k][0], vcvtq_f32_s32(lo01), vmulq_f32(a01s, dx));
        acc[k][0] = vfmaq_f32(acc[k][0], vcvtq_f32_s32(hi01), vmulq_f32(h01s, dx));
        acc[k][1] = vfmaq_f32(acc[k][1], vcvtq_f32_s32(lo23), vmulq_f32(a23s, dx));
        acc[k][1] = vfmaq_f32(acc[k][1], vcvtq_f32_s32(hi23), vmulq_f32(h23s, dx));
      } else {
        const int32x2_t s0 = {start<F>(tk.ns[ta][u]), start<F>(tk.ns[tb][u])};
        int32x4_t i01 = vcombine_s32(s0, s0), i23 = i01;
        for (int p = 0; p < 4; ++p) {
          i01 = vmmlaq_s32(i01, a01[p], b[p]);
          i23 = vmmlaq_s32(i23, a23[p], b[p]);
        }
        acc[k][0] = vfmaq_f32(acc[k][0], vcvtq_f32_s32(i01), vmulq_f32(a01s, dx));
        acc[k][1] = vfmaq_f32(acc[k][1], vcvtq_f32_s32(i23), vmulq_f32(a23s, dx));
        if constexpr (F::kFloatBias) {
          const float32x2_t ss = {tk.s32[ta][u], tk.s32[tb][u]};
          const float32x4_t s = vcombine_f32(ss, ss);
          acc[k][0] = vfmaq_f32(acc[k][0], vzip1q_f32(sc.b, sc.b), s);
          acc[k][1] = vfmaq_f32(acc[k][1], vzip2q_f32(sc.b, sc.b), s);
        }
      }
    }
  }
  for (int k = 0; k < NP; ++k) {
    // [r0 t0, r0 t1, r1 t0, r1 t1], [r2 t0, ...] -> token 0: [r0, r1, r2, r3], token 1 likewise
    const float32x4_t tok[2] = {vuzp1q_f32(acc[k][0], acc[k][1]), vuzp2q_f32(acc[k][0], acc[k][1])};
    for (int t = 0; t < 2; ++t) store_group(tok[t], y + (t0 + 2 * k + t) * ldy + kGroupRows * G.g, valid);
  }
}

template <class F>
void gemm_panels_mm(const RowsView& w, int64_t r0, int64_t r1, const Q8View& x, int64_t t0, int64_t t1, float* y,
                    int64_t ldy) {
  const int64_t nu = w.cols / 32;
  const size_t panel_span = kPanelRows * w.stride;
  const int64_t rows = w.rows > 0 ? w.rows : r1;
  const int64_t ahead = std::max<int64_t>(1, static_cast<int64_t>(kPanelPrefetch / panel_span));
  const size_t slice = (panel_span / static_cast<size_t>(nu) + 63) & ~static_cast<size_t>(63);
  for (int64_t p0 = r0; p0 < r1; p0 += kPanelRows) {
    const uint8_t* panel = w.panel(p0);
    const uint8_t* next = p0 + (ahead + 1) * kPanelRows <= rows ? panel + ahead * panel_span : nullptr;
    const int valid = static_cast<int>(std::min<int64_t>(kPanelRows, r1 - p0));
    float* yp = y + (p0 - r0);
    for (int g = 0; g * kGroupRows < valid; ++g) {
      const Group G{panel, g};
      const int gv = valid - kGroupRows * g;
      const uint8_t* pf = g == 0 ? next : nullptr;  // the next panel, requested while group 0 runs
      int64_t t = t0;
      for (; t + 4 <= t1; t += 4, pf = nullptr) group_tile_mm<F, 2>(G, nu, x, t, yp, ldy, gv, pf, slice);
      if (t + 2 <= t1) {
        group_tile_mm<F, 1>(G, nu, x, t, yp, ldy, gv, pf, slice);
        t += 2;
        pf = nullptr;
      }
      if (t < t1) group_tile<DotCore, F, 1>(G, nu, Tokens<1>(x, t, F::kSplit), yp, t, ldy, gv, pf, slice);
    }
  }
}

}  // namespace
}  // namespace ef::arm

namespace ef {
void install_neon_i8mm(KernelTable& t) {
  using namespace arm;
  const char* n = "neon_i8mm";
  t.gemm_q8_panels[int(Format::q8_0)].set(gemm_panels_mm<NQ8_0>, n);
  t.gemm_q8_panels[int(Format::q4_0)].set(gemm_panels_mm<NQ4_0>, n);
  t.gemm_q8_panels[int(Format::q4_1)].set(gemm_panels_mm<NQ4_1>, n);
  t.gemm_q8_panels[int(Format::q5_0)].set(gemm_panels_mm<NQ5_0>, n);
  t.gemm_q8_panels[int(Format::q4_k)].set(gemm_panels_mm<NQ4_K>, n);
  t.gemm_q8_panels[int(Format::q6_k)].set(gemm_panels_mm<NQ6_K>, n);
  t.gemm_q8_panels[int(Format::q3_k)].set(gemm_panels_mm<NQ3_K>, n);
}
}  // namespace ef
