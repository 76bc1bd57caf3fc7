// Reference norms, RoPE rotation, gated activations, softmax, argmax and top-k.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "kernel_table.h"

namespace ef::ref {
namespace {

void rms_norm(const float* x, const float* w, float* y, int64_t n, int64_t d, float eps) {
  for (int64_t t = 0; t < n; ++t) {
    double ss = 0.0;
    for (int64_t i = 0; i < d; ++i) ss += static_cast<double>(x[t * d + i]) * x[t * d + i];
    const float r = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(d) + eps));
    for (int64_t i = 0; i < d; ++i) y[t * d + i] = x[t * d + i] * r * w[i];
  }
}

void rope_apply(float* x, int64_t n, int64_t n_heads, int64_t hd, int64_t rot_dim, const float* cs) {
  const int64_t half = rot_dim / 2;
  for (int64_t t = 0; t < n; ++t) {
    const float* cosv = cs + t * rot_dim;
    const float* sinv = cosv + half;
    for (int64_t h = 0; h < n_heads; ++h) {
      float* v = x + (t * n_heads + h) * hd;
      for (int64_t i = 0; i < half; ++i) {
        const float x0 = v[i], x1 = v[i + half];
        v[i] = x0 * cosv[i] - x1 * sinv[i];
        v[i + half] = x0 * sinv[i] + x1 * cosv[i];
      }
    }
  }
}

void gated_silu(const float* g, const float* u, float* y, int64_t count) {
  for (int64_t i = 0; i < count; ++i) y[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
}

void gated_gelu(const float* g, const float* u, float* y, int64_t count) {
  const float k = 0.7978845608028654f;  // sqrt(2 / pi)
  for (int64_t i = 0; i < count; ++i) {
    const float v = g[i];
    y[i] = 0.5f * v * (1.0f + std::tanh(k * (v + 0.044715f * v * v * v))) * u[i];
  }
}

void softmax(const float* x, float* y, int64_t n, int64_t d) {
  for (int64_t t = 0; t < n; ++t) {
    const float* xr = x + t * d;
    float* yr = y + t * d;
    const float mx = *std::max_element(xr, xr + d);
    double sum = 0.0;
    for (int64_t i = 0; i < d; ++i) {
      yr[i] = std::exp(xr[i] - mx);
      sum += yr[i];
    }
    const float inv = static_cast<float>(1.0 / sum);
    for (int64_t i = 0; i < d; ++i) yr[i] *= inv;
  }
}

int32_t argmax(const float* x, int64_t d) {
  int64_t best = 0;
  for (int64_t i = 1; i < d; ++i)
    if (x[i] > x[best]) best = i;
  return static_cast<int32_t>(best);
}

void to_half(const float* x, int64_t n, uint16_t* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = f32_to_fp16(x[i]);
}

void topk(const float* x, int64_t d, int64_t k, float* values, int32_t* indices) {
  std::vector<int32_t> idx(static_cast<size_t>(d));
  std::iota(idx.begin(), idx.end(), 0);
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(),
                    [x](int32_t a, int32_t b) { return x[a] > x[b] || (x[a] == x[b] && a < b); });
  for (int64_t i = 0; i < k; ++i) indices[i] = idx[i], values[i] = x[idx[i]];
}

}  // namespace

void install_elementwise(KernelTable& t) {
  const char* n = "ref";
  t.rms_norm.set(rms_norm, n);
  t.rope_apply.set(rope_apply, n);
  t.gated_act[int(Activation::silu)].set(gated_silu, n);
  t.gated_act[int(Activation::gelu_tanh)].set(gated_gelu, n);
  t.softmax.set(softmax, n);
  t.argmax.set(argmax, n);
  t.to_half.set(to_half, n);
  t.topk.set(topk, n);
}

void install_linear(KernelTable& t);
void install_attention(KernelTable& t);

}  // namespace ef::ref

namespace ef {
void install_ref(KernelTable& t) {
  ref::install_linear(t);
  ref::install_attention(t);
  ref::install_elementwise(t);
}
}  // namespace ef
