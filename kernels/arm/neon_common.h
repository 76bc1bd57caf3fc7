// NEON helpers shared by the aarch64 translation units (anonymous namespace: private per TU).
#pragma once

#include <arm_neon.h>

#include <cstdint>
#include <cstring>

#include "edgeflash/formats.h"

namespace ef::arm {
namespace {

inline float h2f(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return vgetq_lane_f32(vcvt_f32_f16(vreinterpret_f16_u16(vdup_n_u16(h))), 0);
}

inline float32x4_t load_h4(const uint8_t* p) {
  return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(reinterpret_cast<const uint16_t*>(p))));
}

// e^x, about 2 ulp on [-87, 88]; inputs are clamped to that range.
inline float32x4_t exp4(float32x4_t x) {
  x = vminq_f32(vmaxq_f32(x, vdupq_n_f32(-87.3f)), vdupq_n_f32(88.7f));
  const float32x4_t n = vrndnq_f32(vmulq_n_f32(x, 1.44269504088896341f));
  float32x4_t r = vfmsq_n_f32(x, n, 0.693359375f);
  r = vfmsq_n_f32(r, n, -2.12194440e-4f);
  float32x4_t p = vdupq_n_f32(1.9875691500e-4f);
  p = vfmaq_f32(vdupq_n_f32(1.3981999507e-3f), p, r);
  p = vfmaq_f32(vdupq_n_f32(8.3334519073e-3f), p, r);
  p = vfmaq_f32(vdupq_n_f32(4.1665795894e-2f), p, r);
  p = vfmaq_f32(vdupq_n_f32(1.6666665459e-1f), p, r);
  p = vfmaq_f32(vdupq_n_f32(5.0000001201e-1f), p, r);
  p = vfmaq_f32(vaddq_f32(r, vdupq_n_f32(1.0f)), p, vmulq_f32(r, r));
  const int32x4_t e = vshlq_n_s32(vaddq_s32(vcvtq_s32_f32(n), vdupq_n_s32(127)), 23);
  return vmulq_f32(p, vreinterpretq_f32_s32(e));
}

inline float32x4_t tanh4(float32x4_t x) {
  const float32x4_t e = exp4(vaddq_f32(x, x));
  return vsubq_f32(vdupq_n_f32(1.0f), vdivq_f32(vdupq_n_f32(2.0f), vaddq_f32(e, vdupq_n_f32(1.0f))));
}

inline float32x4_t silu4(float32x4_t x) {
  return vdivq_f32(x, vaddq_f32(vdupq_n_f32(1.0f), exp4(vnegq_f32(x))));
}

inline float32x4_t gelu4(float32x4_t x) {  // x / (1 + e^{-2y}), y = sqrt(2/pi) (x + 0.044715 x^3)
  const float32x4_t x3 = vmulq_f32(vmulq_f32(x, x), x);
  const float32x4_t y = vmulq_n_f32(vfmaq_n_f32(x, x3, 0.044715f), 0.7978845608028654f);
  return vdivq_f32(x, vaddq_f32(vdupq_n_f32(1.0f), exp4(vmulq_n_f32(y, -2.0f))));
}

}  // namespace
}  // namespace ef::arm
