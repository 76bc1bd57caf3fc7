// f32 / f16 weight GEMM and f32 helpers on AVX2+FMA, shared by the x86 levels.
#pragma once

#include "x86_common.h"
#include "kernel_table.h"

namespace ef::x86 {
namespace {

template <bool F16>
inline __m256 load_w8(const uint8_t* row, int64_t i) {
  if constexpr (F16) {
    return load_h8(row + 2 * i);
  } else {
    return _mm256_loadu_ps(reinterpret_cast<const float*>(row) + i);
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
  __m256 a0[NT], a1[NT];
  const float* xt[NT];
  for (int t = 0; t < NT; ++t) a0[t] = a1[t] = _mm256_setzero_ps(), xt[t] = x + (t0 + t) * cols;
  int64_t i = 0;
  for (; i + 16 <= cols; i += 16) {
    const __m256 w0 = load_w8<F16>(row, i), w1 = load_w8<F16>(row, i + 8);
    for (int t = 0; t < NT; ++t) {
      a0[t] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(xt[t] + i), a0[t]);
      a1[t] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(xt[t] + i + 8), a1[t]);
    }
  }
  for (; i + 8 <= cols; i += 8) {
    const __m256 w0 = load_w8<F16>(row, i);
    for (int t = 0; t < NT; ++t) a0[t] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(xt[t] + i), a0[t]);
  }
  for (int t = 0; t < NT; ++t) {
    float s = hsum(_mm256_add_ps(a0[t], a1[t]));
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
  for (; i + 8 <= cols; i += 8) _mm256_storeu_ps(out + i, load_w8<F16>(row, i));
  for (; i < cols; ++i) out[i] = load_w1<F16>(row, i);
}

// Q8 activations: per block of 32, scale = max|x| / 127, codes rounded to nearest even.
void quantize_acts(const float* x, int64_t cols, int8_t* q, float* d, float* s16, int32_t* sum16) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  for (int64_t b = 0; b < cols / 32; ++b) {
    const float* xb = x + 32 * b;
    __m256 v[4];
    __m256 mx = _mm256_setzero_ps();
    for (int k = 0; k < 4; ++k) {
      v[k] = _mm256_loadu_ps(xb + 8 * k);
      mx = _mm256_max_ps(mx, _mm256_andnot_ps(sign, v[k]));
    }
    const float amax = hmax(mx);
    const float id = amax > 0.0f ? 127.0f / amax : 0.0f;
    d[b] = amax / 127.0f;
    const __m256 idv = _mm256_set1_ps(id);
    __m256i i32[4];
    for (int k = 0; k < 4; ++k) i32[k] = _mm256_cvtps_epi32(_mm256_mul_ps(v[k], idv));
    // half sums from the int32 codes
    const __m256i h0 = _mm256_add_epi32(i32[0], i32[1]), h1 = _mm256_add_epi32(i32[2], i32[3]);
    const __m256 f0 = _mm256_cvtepi32_ps(h0), f1 = _mm256_cvtepi32_ps(h1);
    const float sum0 = hsum(f0), sum1 = hsum(f1);  // exact: integers below 2^24
    s16[2 * b] = d[b] * sum0;
    s16[2 * b + 1] = d[b] * sum1;
    sum16[2 * b] = static_cast<int32_t>(sum0);
    sum16[2 * b + 1] = static_cast<int32_t>(sum1);
    const __m256i p01 = _mm256_packs_epi32(i32[0], i32[1]), p23 = _mm256_packs_epi32(i32[2], i32[3]);
    __m256i p = _mm256_packs_epi16(p01, p23);
    p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + 32 * b), p);
  }
}

template <bool F16>
void ffn_down_f(const uint8_t* const* rows, const float* h, int64_t cnt, int64_t n_tok, int64_t dm, float* out, float*) {
  for (int64_t i = 0; i < cnt; ++i)
    for (int64_t t = 0; t < n_tok; ++t) {
      const float hv = h[t * cnt + i];
      if (hv == 0.0f) continue;
      const __m256 hb = _mm256_set1_ps(hv);
      float* o = out + t * dm;
      int64_t k = 0;
      for (; k + 8 <= dm; k += 8) _mm256_storeu_ps(o + k, _mm256_fmadd_ps(hb, load_w8<F16>(rows[i], k), _mm256_loadu_ps(o + k)));
      for (; k < dm; ++k) o[k] += hv * load_w1<F16>(rows[i], k);
    }
}

}  // namespace
}  // namespace ef::x86
