// AVX2 level: attention chunk, RMSNorm, RoPE rotation, gated activations, softmax, argmax, top-k.
#include <cmath>
#include <limits>

#include "x86_common.h"
#include "kernel_table.h"

namespace ef::x86 {
namespace {

// ---- attention

template <bool Q8>
inline void kv_row(const uint8_t* row, int64_t hd, float* out) {
  if constexpr (!Q8) {
    for (int64_t i = 0; i < hd; i += 8) _mm256_storeu_ps(out + i, load_h8(row + 2 * i));
  } else {
    for (int64_t b = 0; b < hd / 32; ++b) {
      const __m256 d = _mm256_set1_ps(h2f(row + 34 * b));
      const uint8_t* q = row + 34 * b + 2;
      for (int k = 0; k < 4; ++k) {
        const __m256i v = _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(q + 8 * k)));
        _mm256_storeu_ps(out + 32 * b + 8 * k, _mm256_mul_ps(d, _mm256_cvtepi32_ps(v)));
      }
    }
  }
}

// Horizontal sums of 8 vectors at once: [sum a0, ..., sum a7].
inline __m256 hsum8(const __m256* a) {
  const __m256 t0 = _mm256_hadd_ps(_mm256_hadd_ps(a[0], a[1]), _mm256_hadd_ps(a[2], a[3]));
  const __m256 t1 = _mm256_hadd_ps(_mm256_hadd_ps(a[4], a[5]), _mm256_hadd_ps(a[6], a[7]));
  return _mm256_add_ps(_mm256_permute2f128_ps(t0, t1, 0x20), _mm256_permute2f128_ps(t0, t1, 0x31));
}

// Slots go 8 at a time: their K (then V) rows are converted to f32 once into scratch and shared
// by all R query rows; 8 scores per row come out of one transpose-reduce, and the V sums of a
// 32-wide slice stay in registers across the 8 slots.
template <bool Q8>
void attn_chunk(const AttnChunk& a) {
  const int64_t R = a.R, hd = a.hd, c = a.c;
  float* s = a.scratch;             // [R, c]
  float* rows = a.scratch + R * c;  // [8, hd]
  const float ninf = -std::numeric_limits<float>::infinity();
  for (int64_t j0 = 0; j0 < c; j0 += 8) {
    const int64_t nb = c - j0 < 8 ? c - j0 : 8;
    bool any = false;
    for (int64_t r = 0; r < R && !any; ++r) {
      if (nb == 8) {
        uint64_t w;
        std::memcpy(&w, a.vis + (r / a.group) * c + j0, 8);
        any = w != 0;
      } else {
        for (int64_t j = 0; j < nb; ++j) any |= a.vis[(r / a.group) * c + j0 + j] != 0;
      }
    }
    if (!any) {
      for (int64_t r = 0; r < R; ++r)
        for (int64_t j = 0; j < nb; ++j) s[r * c + j0 + j] = ninf;
      continue;
    }
    for (int64_t j = 0; j < 8; ++j) {
      if (j < nb) {
        kv_row<Q8>(a.k + (j0 + j) * a.row_bytes, hd, rows + j * hd);
      } else {
        for (int64_t i = 0; i < hd; i += 8) _mm256_storeu_ps(rows + j * hd + i, _mm256_setzero_ps());
      }
    }
    for (int64_t r = 0; r < R; ++r) {
      const float* q = a.q + r * hd;
      __m256 acc[8];
      for (int j = 0; j < 8; ++j) acc[j] = _mm256_setzero_ps();
      for (int64_t i = 0; i < hd; i += 8) {
        const __m256 qv = _mm256_loadu_ps(q + i);
        for (int j = 0; j < 8; ++j) acc[j] = _mm256_fmadd_ps(qv, _mm256_loadu_ps(rows + j * hd + i), acc[j]);
      }
      const __m256 sc = _mm256_mul_ps(hsum8(acc), _mm256_set1_ps(a.scale));
      if (nb == 8) {
        const __m256i v = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(a.vis + (r / a.group) * c + j0)));
        const __m256 hidden = _mm256_castsi256_ps(_mm256_cmpeq_epi32(v, _mm256_setzero_si256()));
        _mm256_storeu_ps(s + r * c + j0, _mm256_blendv_ps(sc, _mm256_set1_ps(ninf), hidden));
      } else {
        alignas(32) float tmp[8];
        _mm256_store_ps(tmp, sc);
        for (int64_t j = 0; j < nb; ++j) s[r * c + j0 + j] = a.vis[(r / a.group) * c + j0 + j] ? tmp[j] : ninf;
      }
    }
  }
  if (a.softcap > 0.0f) {
    const __m256 cap = _mm256_set1_ps(a.softcap), inv = _mm256_set1_ps(1.0f / a.softcap);
    for (int64_t r = 0; r < R; ++r) {
      float* sr = s + r * c;
      int64_t j = 0;
      for (; j + 8 <= c; j += 8) {
        const __m256 v = _mm256_loadu_ps(sr + j);
        const __m256 t = _mm256_mul_ps(cap, tanh8(_mm256_mul_ps(v, inv)));
        _mm256_storeu_ps(sr + j, _mm256_blendv_ps(t, v, _mm256_cmp_ps(v, _mm256_set1_ps(ninf), _CMP_EQ_OQ)));
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
    const __m256 mv = _mm256_set1_ps(mx);
    int64_t j = 0;
    for (; j + 8 <= c; j += 8) {
      const __m256 v = _mm256_loadu_ps(sr + j);
      // exp8 clamps its input, so hidden (-inf) scores are zeroed explicitly
      const __m256 pz = _mm256_andnot_ps(_mm256_cmp_ps(v, _mm256_set1_ps(ninf), _CMP_EQ_OQ), exp8(_mm256_sub_ps(v, mv)));
      _mm256_storeu_ps(sr + j, pz);
    }
    if (j < c) {  // the last slots of a cache whose capacity is not a multiple of 8: the same exp8
      alignas(32) float t[8];
      for (int64_t k = 0; k < 8; ++k) t[k] = j + k < c ? sr[j + k] : ninf;
      const __m256 v = _mm256_load_ps(t);
      _mm256_store_ps(t, _mm256_andnot_ps(_mm256_cmp_ps(v, _mm256_set1_ps(ninf), _CMP_EQ_OQ), exp8(_mm256_sub_ps(v, mv))));
      for (int64_t k = 0; j + k < c; ++k) sr[j + k] = t[k];
    }
    // Summed one slot after another (hidden slots add an exact 0): a query's sum then depends on the
    // keys it sees, not on the slots between them (a tree's ancestors are not adjacent; in plain
    // decoding they are), whereas 8 lanes would group the keys by slot.
    float sum = 0.0f;
    for (j = 0; j < c; ++j) sum += sr[j];
    a.l[r] = a.l[r] * corr + sum;
    a.m[r] = mx;
    if (corr != 1.0f) {
      const __m256 cv = _mm256_set1_ps(corr);
      float* acc = a.acc + r * hd;
      for (int64_t i = 0; i < hd; i += 8) _mm256_storeu_ps(acc + i, _mm256_mul_ps(cv, _mm256_loadu_ps(acc + i)));
    }
  }
  for (int64_t j0 = 0; j0 < c; j0 += 8) {
    const int64_t nb = c - j0 < 8 ? c - j0 : 8;
    bool any = false;
    for (int64_t r = 0; r < R && !any; ++r) {
      if (a.m[r] == ninf) continue;
      if (nb == 8) {
        any = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(s + r * c + j0), _mm256_setzero_ps(), _CMP_NEQ_UQ)) != 0;
      } else {
        for (int64_t j = 0; j < nb; ++j) any |= s[r * c + j0 + j] != 0.0f;
      }
    }
    if (!any) continue;
    for (int64_t j = 0; j < nb; ++j) kv_row<Q8>(a.v + (j0 + j) * a.row_bytes, hd, rows + j * hd);
    for (int64_t r = 0; r < R; ++r) {
      if (a.m[r] == ninf) continue;
      __m256 p[8];
      for (int64_t j = 0; j < nb; ++j) p[j] = _mm256_set1_ps(s[r * c + j0 + j]);
      float* acc = a.acc + r * hd;
      for (int64_t i = 0; i < hd; i += 16) {
        __m256 a0 = _mm256_loadu_ps(acc + i), a1 = _mm256_loadu_ps(acc + i + 8);
        for (int64_t j = 0; j < nb; ++j) {
          a0 = _mm256_fmadd_ps(p[j], _mm256_loadu_ps(rows + j * hd + i), a0);
          a1 = _mm256_fmadd_ps(p[j], _mm256_loadu_ps(rows + j * hd + i + 8), a1);
        }
        _mm256_storeu_ps(acc + i, a0);
        _mm256_storeu_ps(acc + i + 8, a1);
      }
    }
  }
}

// ---- elementwise

void rms_norm(const float* x, const float* w, float* y, int64_t n, int64_t d, float eps) {
  for (int64_t t = 0; t < n; ++t) {
    const float* xr = x + t * d;
    float* yr = y + t * d;
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= d; i += 16) {
      const __m256 a = _mm256_loadu_ps(xr + i), b = _mm256_loadu_ps(xr + i + 8);
      s0 = _mm256_fmadd_ps(a, a, s0);
      s1 = _mm256_fmadd_ps(b, b, s1);
    }
    double ss = hsum(_mm256_add_ps(s0, s1));
    for (; i < d; ++i) ss += static_cast<double>(xr[i]) * xr[i];
    const float r = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(d) + eps));
    const __m256 rv = _mm256_set1_ps(r);
    for (i = 0; i + 8 <= d; i += 8)
      _mm256_storeu_ps(yr + i, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(xr + i), rv), _mm256_loadu_ps(w + i)));
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
      for (; i + 8 <= half; i += 8) {
        const __m256 x0 = _mm256_loadu_ps(v + i), x1 = _mm256_loadu_ps(v + half + i);
        const __m256 c = _mm256_loadu_ps(cosv + i), s = _mm256_loadu_ps(sinv + i);
        _mm256_storeu_ps(v + i, _mm256_fmsub_ps(x0, c, _mm256_mul_ps(x1, s)));
        _mm256_storeu_ps(v + half + i, _mm256_fmadd_ps(x0, s, _mm256_mul_ps(x1, c)));
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
  for (; i + 8 <= count; i += 8) {
    const __m256 gv = _mm256_loadu_ps(g + i);
    const __m256 a = Gelu ? gelu8(gv) : silu8(gv);
    _mm256_storeu_ps(y + i, _mm256_mul_ps(a, _mm256_loadu_ps(u + i)));
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
    __m256 mv = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
    int64_t i = 0;
    for (; i + 8 <= d; i += 8) mv = _mm256_max_ps(mv, _mm256_loadu_ps(xr + i));
    float mx = hmax(mv);
    for (; i < d; ++i) mx = xr[i] > mx ? xr[i] : mx;
    mv = _mm256_set1_ps(mx);
    __m256 sv = _mm256_setzero_ps();
    for (i = 0; i + 8 <= d; i += 8) {
      const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(xr + i), mv));
      _mm256_storeu_ps(yr + i, e);
      sv = _mm256_add_ps(sv, e);
    }
    double sum = hsum(sv);
    for (; i < d; ++i) {
      yr[i] = std::exp(xr[i] - mx);
      sum += yr[i];
    }
    const __m256 inv = _mm256_set1_ps(static_cast<float>(1.0 / sum));
    for (i = 0; i + 8 <= d; i += 8) _mm256_storeu_ps(yr + i, _mm256_mul_ps(inv, _mm256_loadu_ps(yr + i)));
    for (; i < d; ++i) yr[i] *= static_cast<float>(1.0 / sum);
  }
}

int32_t argmax(const float* x, int64_t d) {
  __m256 mv = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  int64_t i = 0;
  for (; i + 8 <= d; i += 8) mv = _mm256_max_ps(mv, _mm256_loadu_ps(x + i));
  float mx = hmax(mv);
  for (; i < d; ++i) mx = x[i] > mx ? x[i] : mx;
  for (i = 0; i < d; ++i)
    if (x[i] == mx) return static_cast<int32_t>(i);
  return 0;  // all NaN
}

// Top-k with a min-heap kept in the output arrays; a vector compare against the current k-th
// value skips most of a large vocabulary. Order: larger value first, lower index on ties.
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
    if (x[i] > v[0]) {  // later indices lose ties, so only strictly larger values enter
      v[0] = x[i], ix[0] = static_cast<int32_t>(i);
      sift_down(v, ix, k, 0);
    }
  };
  int64_t i = k;
  for (; i < d && (i & 7); ++i) offer(i);
  for (; i + 8 <= d; i += 8) {
    const __m256 gt = _mm256_cmp_ps(_mm256_loadu_ps(x + i), _mm256_set1_ps(v[0]), _CMP_GT_OQ);
    int mask = _mm256_movemask_ps(gt);
    while (mask) {
      const int b = __builtin_ctz(static_cast<unsigned>(mask));
      offer(i + b);
      mask &= mask - 1;
    }
  }
  for (; i < d; ++i) offer(i);
  // heap sort: repeatedly move the worst to the end -> best first
  for (int64_t n = k; n > 1; --n) {
    const float tv = v[0];
    v[0] = v[n - 1], v[n - 1] = tv;
    const int32_t ti = ix[0];
    ix[0] = ix[n - 1], ix[n - 1] = ti;
    sift_down(v, ix, n - 1, 0);
  }
}

// F16C's conversion rounds to nearest even, as f32_to_fp16 does.
void to_half(const float* x, int64_t n, uint16_t* out) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
  for (; i < n; ++i) out[i] = f32_to_fp16(x[i]);
}

}  // namespace
}  // namespace ef::x86

namespace ef {
void install_avx2_ops(KernelTable& t) {
  using namespace x86;
  const char* n = "avx2";
  t.attn_chunk[0].set(attn_chunk<false>, n);
  t.attn_chunk[1].set(attn_chunk<true>, n);
  t.rms_norm.set(x86::rms_norm, n);
  t.rope_apply.set(x86::rope_apply, n);
  t.gated_act[int(Activation::silu)].set(gated<false>, n);
  t.gated_act[int(Activation::gelu_tanh)].set(gated<true>, n);
  t.softmax.set(x86::softmax, n);
  t.argmax.set(x86::argmax, n);
  t.to_half.set(x86::to_half, n);
  t.topk.set(x86::topk, n);
}
}  // namespace ef
