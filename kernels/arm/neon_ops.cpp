// NEON level: attention chunk, RMSNorm, RoPE rotation, gated activations, softmax, argmax, top-k.
#include <cmath>
#include <limits>

#include "kernel_table.h"
#include "neon_common.h"

namespace ef::arm {
namespace {

template <bool Q8>
inline void kv_row(const uint8_t* row, int64_t hd, float* out) {
  if constexpr (!Q8) {
    for (int64_t i = 0; i < hd; i += 4) vst1q_f32(out + i, load_h4(row + 2 * i));
  } else {
    for (int64_t b = 0; b < hd / 32; ++b) {
      const float d = h2f(row + 34 * b);
      const int8_t* q = reinterpret_cast<const int8_t*>(row + 34 * b + 2);
      for (int k = 0; k < 2; ++k) {
        const int8x16_t v = vld1q_s8(q + 16 * k);
        const int16x8_t w0 = vmovl_s8(vget_low_s8(v)), w1 = vmovl_s8(vget_high_s8(v));
        float* o = out + 32 * b + 16 * k;
        vst1q_f32(o, vmulq_n_f32(vcvtq_f32_s32(vmovl_s16(vget_low_s16(w0))), d));
        vst1q_f32(o + 4, vmulq_n_f32(vcvtq_f32_s32(vmovl_s16(vget_high_s16(w0))), d));
        vst1q_f32(o + 8, vmulq_n_f32(vcvtq_f32_s32(vmovl_s16(vget_low_s16(w1))), d));
        vst1q_f32(o + 12, vmulq_n_f32(vcvtq_f32_s32(vmovl_s16(vget_high_s16(w1))), d));
      }
    }
  }
}

// [sum a0, sum a1, sum a2, sum a3]
inline float32x4_t hsum4x4(const float32x4_t* a) { return vpaddq_f32(vpaddq_f32(a[0], a[1]), vpaddq_f32(a[2], a[3])); }

// Same structure as the AVX2 kernel: 8 slots at a time, K/V rows converted once into scratch
// and shared by all R query rows, scores by transpose-reduce, V sums of a slice in registers.
template <bool Q8>
void attn_chunk(const AttnChunk& a) {
  const int64_t R = a.R, hd = a.hd, c = a.c;
  float* s = a.scratch;             // [R, c]
  float* rows = a.scratch + R * c;  // [8, hd]
  const float ninf = -std::numeric_limits<float>::infinity();
  for (int64_t j0 = 0; j0 < c; j0 += 8) {
    const int64_t nb = c - j0 < 8 ? c - j0 : 8;
    bool any = false;
    for (int64_t r = 0; r < R && !any; ++r)
      for (int64_t j = 0; j < nb; ++j) any |= a.vis[(r / a.group) * c + j0 + j] != 0;
    if (!any) {
      for (int64_t r = 0; r < R; ++r)
        for (int64_t j = 0; j < nb; ++j) s[r * c + j0 + j] = ninf;
      continue;
    }
    for (int64_t j = 0; j < 8; ++j) {
      if (j < nb) {
        kv_row<Q8>(a.k + (j0 + j) * a.row_bytes, hd, rows + j * hd);
      } else {
        for (int64_t i = 0; i < hd; i += 4) vst1q_f32(rows + j * hd + i, vdupq_n_f32(0.0f));
      }
    }
    for (int64_t r = 0; r < R; ++r) {
      const float* q = a.q + r * hd;
      float32x4_t acc[8];
      for (int j = 0; j < 8; ++j) acc[j] = vdupq_n_f32(0.0f);
      for (int64_t i = 0; i < hd; i += 4) {
        const float32x4_t qv = vld1q_f32(q + i);
        for (int j = 0; j < 8; ++j) acc[j] = vfmaq_f32(acc[j], qv, vld1q_f32(rows + j * hd + i));
      }
      float sc[8];
      vst1q_f32(sc, vmulq_n_f32(hsum4x4(acc), a.scale));
      vst1q_f32(sc + 4, vmulq_n_f32(hsum4x4(acc + 4), a.scale));
      for (int64_t j = 0; j < nb; ++j) s[r * c + j0 + j] = a.vis[(r / a.group) * c + j0 + j] ? sc[j] : ninf;
    }
  }
  if (a.softcap > 0.0f) {
    for (int64_t r = 0; r < R; ++r) {
      float* sr = s + r * c;
      int64_t j = 0;
      for (; j + 4 <= c; j += 4) {
        const float32x4_t v = vld1q_f32(sr + j);
        const float32x4_t t = vmulq_n_f32(tanh4(vmulq_n_f32(v, 1.0f / a.softcap)), a.softcap);
        vst1q_f32(sr + j, vbslq_f32(vceqq_f32(v, vdupq_n_f32(ninf)), v, t));
      }
      for (; j < c; ++j)
        if (sr[j] != ninf) sr[j] = a.softcap * std::tanh(sr[j] / a.softcap);
    }
  }
  for (int64_t r = 0; r < R; ++r) {
    float* sr = s + r * c;
    float mx = a.m[r];
    for (int64_t j = 0; j < c; ++j) mx = sr[j] > mx ? sr[j] : mx;
    if (mx == ninf) continue;
    const float corr = a.m[r] == ninf ? 0.0f : std::exp(a.m[r] - mx);
    int64_t j = 0;
    for (; j + 4 <= c; j += 4) {
      const float32x4_t v = vld1q_f32(sr + j);
      const float32x4_t pz = vbslq_f32(vceqq_f32(v, vdupq_n_f32(ninf)), vdupq_n_f32(0.0f), exp4(vsubq_f32(v, vdupq_n_f32(mx))));
      vst1q_f32(sr + j, pz);
    }
    if (j < c) {  // the last slots of a cache whose capacity is not a multiple of 4: the same exp4
      float t[4];
      for (int64_t k = 0; k < 4; ++k) t[k] = j + k < c ? sr[j + k] : ninf;
      const float32x4_t v = vld1q_f32(t);
      vst1q_f32(t, vbslq_f32(vceqq_f32(v, vdupq_n_f32(ninf)), vdupq_n_f32(0.0f), exp4(vsubq_f32(v, vdupq_n_f32(mx)))));
      for (int64_t k = 0; j + k < c; ++k) sr[j + k] = t[k];
    }
    // one slot after another, so the sum depends on the keys seen, not on the slots between them
    float sum = 0.0f;
    for (j = 0; j < c; ++j) sum += sr[j];
    a.l[r] = a.l[r] * corr + sum;
    a.m[r] = mx;
    if (corr != 1.0f) {
      float* acc = a.acc + r * hd;
      for (int64_t i = 0; i < hd; i += 4) vst1q_f32(acc + i, vmulq_n_f32(vld1q_f32(acc + i), corr));
    }
  }
  for (int64_t j0 = 0; j0 < c; j0 += 8) {
    const int64_t nb = c - j0 < 8 ? c - j0 : 8;
    bool any = false;
    for (int64_t r = 0; r < R; ++r) {
      if (a.m[r] == ninf) continue;
      for (int64_t j = 0; j < nb; ++j) any |= s[r * c + j0 + j] != 0.0f;
    }
    if (!any) continue;
    for (int64_t j = 0; j < nb; ++j) kv_row<Q8>(a.v + (j0 + j) * a.row_bytes, hd, rows + j * hd);
    for (int64_t r = 0; r < R; ++r) {
      if (a.m[r] == ninf) continue;
      const float* p = s + r * c + j0;
      float* acc = a.acc + r * hd;
      for (int64_t i = 0; i < hd; i += 8) {
        float32x4_t a0 = vld1q_f32(acc + i), a1 = vld1q_f32(acc + i + 4);
        for (int64_t j = 0; j < nb; ++j) {
          a0 = vfmaq_n_f32(a0, vld1q_f32(rows + j * hd + i), p[j]);
          a1 = vfmaq_n_f32(a1, vld1q_f32(rows + j * hd + i + 4), p[j]);
        }
        vst1q_f32(acc + i, a0);
        vst1q_f32(acc + i + 4, a1);
      }
    }
  }
}

void rms_norm(const float* x, const float* w, float* y, int64_t n, int64_t d, float eps) {
  for (int64_t t = 0; t < n; ++t) {
    const float* xr = x + t * d;
    float* yr = y + t * d;
    float32x4_t s0 = vdupq_n_f32(0.0f), s1 = vdupq_n_f32(0.0f);
    int64_t i = 0;
    for (; i + 8 <= d; i += 8) {
      const float32x4_t a = vld1q_f32(xr + i), b = vld1q_f32(xr + i + 4);
      s0 = vfmaq_f32(s0, a, a);
      s1 = vfmaq_f32(s1, b, b);
    }
    double ss = vaddvq_f32(vaddq_f32(s0, s1));
    for (; i < d; ++i) ss += static_cast<double>(xr[i]) * xr[i];
    const float r = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(d) + eps));
    for (i = 0; i + 4 <= d; i += 4) vst1q_f32(yr + i, vmulq_f32(vmulq_n_f32(vld1q_f32(xr + i), r), vld1q_f32(w + i)));
    for (; i < d; ++i) yr[i] = xr[i] * r * w[i];
  }
}

void rope_apply(float* x, int64_t n, int64_t n_heads, int64_t hd, int64_t rot_dim, const float* cs) {
  const int64_t half = rot_dim / 2;
  for (int64_t t = 0; t < n; ++t) {
    const float* cosv = cs + t * rot_dim;
    const float* sinv = cosv + half;
    for (int64_t h = 0; h < n_heads; ++h) {
      float* v = x + (t * n_heads + h) * hd;
      int64_t i = 0;
      for (; i + 4 <= half; i += 4) {
        const float32x4_t x0 = vld1q_f32(v + i), x1 = vld1q_f32(v + half + i);
        const float32x4_t c = vld1q_f32(cosv + i), s = vld1q_f32(sinv + i);
        vst1q_f32(v + i, vfmsq_f32(vmulq_f32(x0, c), x1, s));
        vst1q_f32(v + half + i, vfmaq_f32(vmulq_f32(x1, c), x0, s));
      }
      for (; i < half; ++i) {
        const float x0 = v[i], x1 = v[i + half];
        v[i] = x0 * cosv[i] - x1 * sinv[i];
        v[i + half] = x0 * sinv[i] + x1 * cosv[i];
      }
    }
  }
}

template <bool Gelu>
void gated(const float* g, const float* u, float* y, int64_t count) {
  int64_t i = 0;
  for (; i + 4 <= count; i += 4) {
    const float32x4_t gv = vld1q_f32(g + i);
    vst1q_f32(y + i, vmulq_f32(Gelu ? gelu4(gv) : silu4(gv), vld1q_f32(u + i)));
  }
  for (; i < count; ++i) {
    const float v = g[i];
    const float a = Gelu ? v / (1.0f + std::exp(-2.0f * 0.7978845608028654f * (v + 0.044715f * v * v * v)))
                         : v / (1.0f + std::exp(-v));
    y[i] = a * u[i];
  }
}

void softmax(const float* x, float* y, int64_t n, int64_t d) {
  for (int64_t t = 0; t < n; ++t) {
    const float* xr = x + t * d;
    float* yr = y + t * d;
    float32x4_t mv = vdupq_n_f32(-std::numeric_limits<float>::infinity());
    int64_t i = 0;
    for (; i + 4 <= d; i += 4) mv = vmaxq_f32(mv, vld1q_f32(xr + i));
    float mx = vmaxvq_f32(mv);
    for (; i < d; ++i) mx = xr[i] > mx ? xr[i] : mx;
    float32x4_t sv = vdupq_n_f32(0.0f);
    for (i = 0; i + 4 <= d; i += 4) {
      const float32x4_t e = exp4(vsubq_f32(vld1q_f32(xr + i), vdupq_n_f32(mx)));
      vst1q_f32(yr + i, e);
      sv = vaddq_f32(sv, e);
    }
    double sum = vaddvq_f32(sv);
    for (; i < d; ++i) {
      yr[i] = std::exp(xr[i] - mx);
      sum += yr[i];
    }
    const float inv = static_cast<float>(1.0 / sum);
    for (i = 0; i + 4 <= d; i += 4) vst1q_f32(yr + i, vmulq_n_f32(vld1q_f32(yr + i), inv));
    for (; i < d; ++i) yr[i] *= inv;
  }
}

int32_t argmax(const float* x, int64_t d) {
  float32x4_t mv = vdupq_n_f32(-std::numeric_limits<float>::infinity());
  int64_t i = 0;
  for (; i + 4 <= d; i += 4) mv = vmaxq_f32(mv, vld1q_f32(x + i));
  float mx = vmaxvq_f32(mv);
  for (; i < d; ++i) mx = x[i] > mx ? x[i] : mx;
  for (i = 0; i < d; ++i)
    if (x[i] == mx) return static_cast<int32_t>(i);
  return 0;
}

inline bool worse(float va, int32_t ia, float vb, int32_t ib) { return va < vb || (va == vb && ia > ib); }

inline void sift_down(float* v, int32_t* ix, int64_t n, int64_t i) {
  for (;;) {
    int64_t m = i;
    const int64_t l = 2 * i + 1, r = l + 1;
    if (l < n && worse(v[l], ix[l], v[m], ix[m])) m = l;
    if (r < n && worse(v[r], ix[r], v[m], ix[m])) m = r;
    if (m == i) return;
    const float tv = v[i];
    v[i] = v[m], v[m] = tv;
    const int32_t ti = ix[i];
    ix[i] = ix[m], ix[m] = ti;
    i = m;
  }
}

void topk(const float* x, int64_t d, int64_t k, float* v, int32_t* ix) {
  for (int64_t i = 0; i < k; ++i) v[i] = x[i], ix[i] = static_cast<int32_t>(i);
  for (int64_t i = k / 2; i-- > 0;) sift_down(v, ix, k, i);
  auto offer = [&](int64_t i) {
    if (x[i] > v[0]) {
      v[0] = x[i], ix[0] = static_cast<int32_t>(i);
      sift_down(v, ix, k, 0);
    }
  };
  int64_t i = k;
  for (; i < d && (i & 3); ++i) offer(i);
  for (; i + 4 <= d; i += 4) {
    const uint32x4_t gt = vcgtq_f32(vld1q_f32(x + i), vdupq_n_f32(v[0]));
    if (vmaxvq_u32(gt) == 0) continue;
    for (int b = 0; b < 4; ++b) offer(i + b);
  }
  for (; i < d; ++i) offer(i);
  for (int64_t n = k; n > 1; --n) {
    const float tv = v[0];
    v[0] = v[n - 1], v[n - 1] = tv;
    const int32_t ti = ix[0];
    ix[0] = ix[n - 1], ix[n - 1] = ti;
    sift_down(v, ix, n - 1, 0);
  }
}

// FPCR's default rounding (to nearest even), as f32_to_fp16.
void to_half(const float* x, int64_t n, uint16_t* out) {
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) vst1_u16(out + i, vreinterpret_u16_f16(vcvt_f16_f32(vld1q_f32(x + i))));
  for (; i < n; ++i) out[i] = f32_to_fp16(x[i]);
}

}  // namespace
}  // namespace ef::arm

namespace ef {
void install_neon_ops(KernelTable& t) {
  using namespace arm;
  const char* n = "neon";
  t.attn_chunk[0].set(attn_chunk<false>, n);
  t.attn_chunk[1].set(attn_chunk<true>, n);
  t.rms_norm.set(arm::rms_norm, n);
  t.rope_apply.set(arm::rope_apply, n);
  t.gated_act[int(Activation::silu)].set(gated<false>, n);
  t.gated_act[int(Activation::gelu_tanh)].set(gated<true>, n);
  t.softmax.set(arm::softmax, n);
  t.argmax.set(arm::argmax, n);
  t.to_half.set(arm::to_half, n);
  t.topk.set(arm::topk, n);
}
}  // namespace ef
