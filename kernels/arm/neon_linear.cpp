// NEON level (ARMv8.0, e.g. Cortex-A53/A72): quantized GEMM with smull/smlal, float GEMM,
// dequantization, activation quantization.
#include "neon_lut_panel.h"
#include "neon_panel.h"
#include "neon_quant.h"

namespace ef::arm {
namespace {

struct MullCore {
  static inline int32x4_t dot(int8x16_t c, int8x16_t x) {
    // pairs of products fit int16: |c|, |x| <= 128, 127
    return vpaddlq_s16(vmlal_high_s8(vmull_s8(vget_low_s8(c), vget_low_s8(x)), c, x));
  }
  static inline int32x4_t dot2(int8x16_t c0, int8x16_t x0, int8x16_t c1, int8x16_t x1) {
    return vpadalq_s16(dot(c0, x0), vmlal_high_s8(vmull_s8(vget_low_s8(c1), vget_low_s8(x1)), c1, x1));
  }
  // acc[i] += dot(bytes 4i..4i+3 of w, bytes 4L..4L+3 of x): the activation word broadcast to every
  // lane, 16 products, then pairwise sums down to 4 per lane (each pair fits int16).
  template <int L>
  static inline int32x4_t lane(int32x4_t acc, int8x16_t w, int8x16_t x) {
    const int8x16_t xl = vreinterpretq_s8_s32(vdupq_laneq_s32(vreinterpretq_s32_s8(x), L));
    const int16x8_t p = vpaddq_s16(vmull_s8(vget_low_s8(w), vget_low_s8(xl)), vmull_high_s8(w, xl));
    return vpadalq_s16(acc, p);
  }
};

template <bool F16>
inline float32x4_t load_w4(const uint8_t* row, int64_t i) {
  if constexpr (F16) {
    return load_h4(row + 2 * i);
  } else {
    return vld1q_f32(reinterpret_cast<const float*>(row) + i);
  }
}

template <bool F16>
inline float load_w1(const uint8_t* row, int64_t i) {
  if constexpr (F16) {
    return h2f(row + 2 * i);
  } else {
    float f;
    std::memcpy(&f, row + 4 * i, 4);
    return f;
  }
}

template <bool F16, int NT>
inline void gemm_f_tile(const uint8_t* row, const float* x, int64_t cols, int64_t t0, float* y, int64_t ldy) {
  float32x4_t a0[NT], a1[NT];
  const float* xt[NT];
  for (int t = 0; t < NT; ++t) a0[t] = a1[t] = vdupq_n_f32(0.0f), xt[t] = x + (t0 + t) * cols;
  int64_t i = 0;
  for (; i + 8 <= cols; i += 8) {
    const float32x4_t w0 = load_w4<F16>(row, i), w1 = load_w4<F16>(row, i + 4);
    for (int t = 0; t < NT; ++t) {
      a0[t] = vfmaq_f32(a0[t], w0, vld1q_f32(xt[t] + i));
      a1[t] = vfmaq_f32(a1[t], w1, vld1q_f32(xt[t] + i + 4));
    }
  }
  for (int t = 0; t < NT; ++t) {
    float s = vaddvq_f32(vaddq_f32(a0[t], a1[t]));
    for (int64_t k = i; k < cols; ++k) s += load_w1<F16>(row, k) * xt[t][k];
    y[(t0 + t) * ldy] = s;
  }
}

template <bool F16>
void gemm_f(const RowsView& w, int64_t r0, int64_t r1, const float* x, int64_t t0, int64_t t1, float* y, int64_t ldy) {
  for (int64_t t = t0; t < t1; t += 4) {
    const int64_t nt = t1 - t < 4 ? t1 - t : 4;
    for (int64_t r = r0; r < r1; ++r) {
      const uint8_t* row = w.row(r);
      float* yr = y + (r - r0);
      switch (nt) {
        case 1: gemm_f_tile<F16, 1>(row, x, w.cols, t, yr, ldy); break;
        case 2: gemm_f_tile<F16, 2>(row, x, w.cols, t, yr, ldy); break;
        case 3: gemm_f_tile<F16, 3>(row, x, w.cols, t, yr, ldy); break;
        default: gemm_f_tile<F16, 4>(row, x, w.cols, t, yr, ldy); break;
      }
    }
  }
}

template <bool F16>
void dequant_f(const uint8_t* row, int64_t cols, float* out) {
  int64_t i = 0;
  for (; i + 4 <= cols; i += 4) vst1q_f32(out + i, load_w4<F16>(row, i));
  for (; i < cols; ++i) out[i] = load_w1<F16>(row, i);
}

void quantize_acts(const float* x, int64_t cols, int8_t* q, float* d, float* s16, int32_t* sum16) {
  for (int64_t b = 0; b < cols / 32; ++b) {
    const float* xb = x + 32 * b;
    float32x4_t v[8];
    float32x4_t mx = vdupq_n_f32(0.0f);
    for (int k = 0; k < 8; ++k) {
      v[k] = vld1q_f32(xb + 4 * k);
      mx = vmaxq_f32(mx, vabsq_f32(v[k]));
    }
    const float amax = vmaxvq_f32(mx);
    const float id = amax > 0.0f ? 127.0f / amax : 0.0f;
    d[b] = amax / 127.0f;
    int32x4_t i32[8];
    for (int k = 0; k < 8; ++k) i32[k] = vcvtnq_s32_f32(vmulq_n_f32(v[k], id));
    const int32x4_t h0 = vaddq_s32(vaddq_s32(i32[0], i32[1]), vaddq_s32(i32[2], i32[3]));
    const int32x4_t h1 = vaddq_s32(vaddq_s32(i32[4], i32[5]), vaddq_s32(i32[6], i32[7]));
    sum16[2 * b] = vaddvq_s32(h0);
    sum16[2 * b + 1] = vaddvq_s32(h1);
    s16[2 * b] = d[b] * static_cast<float>(sum16[2 * b]);
    s16[2 * b + 1] = d[b] * static_cast<float>(sum16[2 * b + 1]);
    for (int k = 0; k < 2; ++k) {
      const int16x8_t a = vcombine_s16(vqmovn_s32(i32[4 * k]), vqmovn_s32(i32[4 * k + 1]));
      const int16x8_t c = vcombine_s16(vqmovn_s32(i32[4 * k + 2]), vqmovn_s32(i32[4 * k + 3]));
      vst1q_s8(q + 32 * b + 16 * k, vcombine_s8(vqmovn_s16(a), vqmovn_s16(c)));
    }
  }
}

template <bool F16>
void ffn_down_f(const uint8_t* const* rows, const float* h, int64_t cnt, int64_t n_tok, int64_t dm, float* out, float*) {
  for (int64_t i = 0; i < cnt; ++i)
    for (int64_t t = 0; t < n_tok; ++t) {
      const float hv = h[t * cnt + i];
      if (hv == 0.0f) continue;
      float* o = out + t * dm;
      int64_t k = 0;
      for (; k + 4 <= dm; k += 4) vst1q_f32(o + k, vfmaq_n_f32(vld1q_f32(o + k), load_w4<F16>(rows[i], k), hv));
      for (; k < dm; ++k) o[k] += hv * load_w1<F16>(rows[i], k);
    }
}

}  // namespace
}  // namespace ef::arm

namespace ef {
void install_neon(KernelTable& t) {
  using namespace arm;
  const char* n = "neon";
  t.gemm_q8[int(Format::q8_0)].set(gemm_q8<MullCore, Q8_0>, n);
  t.gemm_q8[int(Format::q4_0)].set(gemm_q8<MullCore, Q4_0>, n);
  t.gemm_q8[int(Format::q4_1)].set(gemm_q8<MullCore, Q4_1>, n);
  t.gemm_q8[int(Format::q5_0)].set(gemm_q8<MullCore, Q5_0>, n);
  t.gemm_q8[int(Format::q4_k)].set(gemm_q8<MullCore, Q4_K>, n);
  t.gemm_q8[int(Format::q6_k)].set(gemm_q8<MullCore, Q6_K>, n);
  t.gemm_q8[int(Format::q3_k)].set(gemm_q8<MullCore, Q3_K>, n);
  t.gemm_q8[int(Format::q4_lut)].set(gemm_q8<MullCore, Q4_LUT>, n);
  t.gemm_q8_panels[int(Format::q8_0)].set(gemm_panels<MullCore, NQ8_0>, n);
  t.gemm_q8_panels[int(Format::q4_0)].set(gemm_panels<MullCore, NQ4_0>, n);
  t.gemm_q8_panels[int(Format::q4_1)].set(gemm_panels<MullCore, NQ4_1>, n);
  t.gemm_q8_panels[int(Format::q5_0)].set(gemm_panels<MullCore, NQ5_0>, n);
  t.gemm_q8_panels[int(Format::q4_k)].set(gemm_panels<MullCore, NQ4_K>, n);
  t.gemm_q8_panels[int(Format::q6_k)].set(gemm_panels<MullCore, NQ6_K>, n);
  t.gemm_q8_panels[int(Format::q3_k)].set(gemm_panels<MullCore, NQ3_K>, n);
  t.gemm_q8_panels[int(Format::q4_lut)].set(gemm_panels_lut<MullCore>, n);
  t.gemm_f32[int(Format::f32)].set(gemm_f<false>, n);
  t.gemm_f32[int(Format::f16)].set(gemm_f<true>, n);
  t.dequant[int(Format::f32)].set(dequant_f<false>, n);
  t.dequant[int(Format::f16)].set(dequant_f<true>, n);
  t.dequant[int(Format::q8_0)].set(dequant<Q8_0>, n);
  t.dequant[int(Format::q4_0)].set(dequant<Q4_0>, n);
  t.dequant[int(Format::q4_1)].set(dequant<Q4_1>, n);
  t.dequant[int(Format::q5_0)].set(dequant<Q5_0>, n);
  t.dequant[int(Format::q4_k)].set(dequant<Q4_K>, n);
  t.dequant[int(Format::q6_k)].set(dequant<Q6_K>, n);
  t.dequant[int(Format::q3_k)].set(dequant<Q3_K>, n);
  t.dequant[int(Format::q4_lut)].set(dequant<Q4_LUT>, n);
  t.ffn_down[int(Format::f32)].set(ffn_down_f<false>, n);
  t.ffn_down[int(Format::f16)].set(ffn_down_f<true>, n);
  t.ffn_down[int(Format::q8_0)].set(ffn_down<Q8_0>, n);
  t.ffn_down[int(Format::q4_0)].set(ffn_down<Q4_0>, n);
  t.ffn_down[int(Format::q4_1)].set(ffn_down<Q4_1>, n);
  t.ffn_down[int(Format::q5_0)].set(ffn_down<Q5_0>, n);
  t.ffn_down[int(Format::q4_k)].set(ffn_down<Q4_K>, n);
  t.ffn_down[int(Format::q6_k)].set(ffn_down<Q6_K>, n);
  t.ffn_down[int(Format::q3_k)].set(ffn_down<Q3_K>, n);
  t.ffn_down[int(Format::q4_lut)].set(ffn_down<Q4_LUT>, n);
  t.quantize_acts.set(quantize_acts, n);
  void install_neon_ops(KernelTable & t);
  install_neon_ops(t);
}
}  // namespace ef
