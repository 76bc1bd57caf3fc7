// Reference attention chunk: scalar online softmax over one chunk of KV slots.
#include <cmath>
#include <limits>

#include "kernel_table.h"
#include "ref_formats.h"

namespace ef::ref {
namespace {

template <Format KF>
void kv_row_to_f32(const uint8_t* row, int64_t hd, float* out) {
  if constexpr (KF == Format::f16) {
    for (int64_t i = 0; i < hd; ++i) out[i] = load_fp16(row + 2 * i);
  } else {
    for (int64_t b = 0; b < hd / 32; ++b) {
      const float d = load_fp16(row + 34 * b);
      for (int k = 0; k < 32; ++k) out[32 * b + k] = d * static_cast<int8_t>(row[34 * b + 2 + k]);
    }
  }
}

template <Format KF>
void attn_chunk(const AttnChunk& a) {
  const int64_t R = a.R, hd = a.hd, c = a.c;
  float* s = a.scratch;            // [R, c]
  float* row = a.scratch + R * c;  // [hd]
  const float ninf = -std::numeric_limits<float>::infinity();
  for (int64_t j = 0; j < c; ++j) {
    kv_row_to_f32<KF>(a.k + j * a.row_bytes, hd, row);
    for (int64_t r = 0; r < R; ++r) {
      if (!a.vis[(r / a.group) * c + j]) {
        s[r * c + j] = ninf;
        continue;
      }
      double dot = 0.0;
      for (int64_t i = 0; i < hd; ++i) dot += static_cast<double>(a.q[r * hd + i]) * row[i];
      float v = static_cast<float>(dot) * a.scale;
      if (a.softcap > 0.0f) v = a.softcap * std::tanh(v / a.softcap);
      s[r * c + j] = v;
    }
  }
  for (int64_t r = 0; r < R; ++r) {
    float mx = a.m[r];
    for (int64_t j = 0; j < c; ++j) mx = std::fmax(mx, s[r * c + j]);
    if (mx == ninf) continue;  // nothing visible yet
    const float corr = a.m[r] == ninf ? 0.0f : std::exp(a.m[r] - mx);
    double sum = 0.0;
    for (int64_t j = 0; j < c; ++j) {
      const float p = s[r * c + j] == ninf ? 0.0f : std::exp(s[r * c + j] - mx);
      s[r * c + j] = p;
      sum += p;
    }
    a.l[r] = a.l[r] * corr + static_cast<float>(sum);
    a.m[r] = mx;
    for (int64_t i = 0; i < hd; ++i) a.acc[r * hd + i] *= corr;
  }
  for (int64_t j = 0; j < c; ++j) {
    kv_row_to_f32<KF>(a.v + j * a.row_bytes, hd, row);
    for (int64_t r = 0; r < R; ++r) {
      if (a.m[r] == ninf) continue;
      const float p = s[r * c + j];
      if (p == 0.0f) continue;
      for (int64_t i = 0; i < hd; ++i) a.acc[r * hd + i] += p * row[i];
    }
  }
}

}  // namespace

void install_attention(KernelTable& t) {
  t.attn_chunk[0].set(attn_chunk<Format::f16>, "ref");
  t.attn_chunk[1].set(attn_chunk<Format::q8_0>, "ref");
}

}  // namespace ef::ref
