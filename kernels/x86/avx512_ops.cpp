// AVX-512 level: the attention chunk on 512-bit registers. The same algorithm as the AVX2 one
// (avx2_ops.cpp): slots 8 at a time, their K (then V) rows converted to f32 once and shared by
// every query row of the chunk, 8 scores per row from one reduction, an online softmax; only the
// head_dim loops are 16 wide, which halves the multiply-adds of both products.
#include <cmath>
#include <limits>

#include "kernel_table.h"
#include "x86_common.h"

namespace ef::x86 {
namespace {

template <bool Q8>
inline void kv_row(const uint8_t* row, int64_t hd, float* out) {
  if constexpr (!Q8) {
    for (int64_t i = 0; i < hd; i += 16)
      _mm512_storeu_ps(out + i, _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + 2 * i))));
  } else {
    for (int64_t b = 0; b < hd / 32; ++b) {
      const __m512 d = _mm512_set1_ps(h2f(row + 34 * b));
      const uint8_t* q = row + 34 * b + 2;
      for (int k = 0; k < 2; ++k) {
        const __m512i v = _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q + 16 * k)));
        _mm512_storeu_ps(out + 32 * b + 16 * k, _mm512_mul_ps(d, _mm512_cvtepi32_ps(v)));
      }
    }
  }
}

// [sum a0, ..., sum a7] of 8 vectors.
inline __m256 hsum8(const __m512* a) {
  __m256 h[8];
  for (int j = 0; j < 8; ++j) h[j] = _mm256_add_ps(_mm512_castps512_ps256(a[j]), _mm512_extractf32x8_ps(a[j], 1));
  const __m256 t0 = _mm256_hadd_ps(_mm256_hadd_ps(h[0], h[1]), _mm256_hadd_ps(h[2], h[3]));
  const __m256 t1 = _mm256_hadd_ps(_mm256_hadd_ps(h[4], h[5]), _mm256_hadd_ps(h[6], h[7]));
  return _mm256_add_ps(_mm256_permute2f128_ps(t0, t1, 0x20), _mm256_permute2f128_ps(t0, t1, 0x31));
}

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
        std::memcpy(&w, a.vis + r * c + j0, 8);
        any = w != 0;
      } else {
        for (int64_t j = 0; j < nb; ++j) any |= a.vis[r * c + j0 + j] != 0;
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
        for (int64_t i = 0; i < hd; i += 16) _mm512_storeu_ps(rows + j * hd + i, _mm512_setzero_ps());
      }
    }
    for (int64_t r = 0; r < R; ++r) {
      const float* q = a.q + r * hd;
      __m512 acc[8];
      for (int j = 0; j < 8; ++j) acc[j] = _mm512_setzero_ps();
      for (int64_t i = 0; i < hd; i += 16) {
        const __m512 qv = _mm512_loadu_ps(q + i);
        for (int j = 0; j < 8; ++j) acc[j] = _mm512_fmadd_ps(qv, _mm512_loadu_ps(rows + j * hd + i), acc[j]);
      }
      const __m256 sc = _mm256_mul_ps(hsum8(acc), _mm256_set1_ps(a.scale));
      if (nb == 8) {
        const __m256i v = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(a.vis + r * c + j0)));
        const __m256 hidden = _mm256_castsi256_ps(_mm256_cmpeq_epi32(v, _mm256_setzero_si256()));
        _mm256_storeu_ps(s + r * c + j0, _mm256_blendv_ps(sc, _mm256_set1_ps(ninf), hidden));
      } else {
        alignas(32) float tmp[8];
        _mm256_store_ps(tmp, sc);
        for (int64_t j = 0; j < nb; ++j) s[r * c + j0 + j] = a.vis[r * c + j0 + j] ? tmp[j] : ninf;
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
    __m256 sum = _mm256_setzero_ps();
    int64_t j = 0;
    for (; j + 8 <= c; j += 8) {
      const __m256 v = _mm256_loadu_ps(sr + j);
      // exp8 clamps its input, so hidden (-inf) scores are zeroed explicitly
      const __m256 pz = _mm256_andnot_ps(_mm256_cmp_ps(v, _mm256_set1_ps(ninf), _CMP_EQ_OQ), exp8(_mm256_sub_ps(v, mv)));
      _mm256_storeu_ps(sr + j, pz);
      sum = _mm256_add_ps(sum, pz);
    }
    float tail = 0.0f;
    for (; j < c; ++j) {
      sr[j] = sr[j] == ninf ? 0.0f : std::exp(sr[j] - mx);
      tail += sr[j];
    }
    a.l[r] = a.l[r] * corr + hsum(sum) + tail;
    a.m[r] = mx;
    if (corr != 1.0f) {
      const __m512 cv = _mm512_set1_ps(corr);
      float* acc = a.acc + r * hd;
      for (int64_t i = 0; i < hd; i += 16) _mm512_storeu_ps(acc + i, _mm512_mul_ps(cv, _mm512_loadu_ps(acc + i)));
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
      __m512 p[8];
      for (int64_t j = 0; j < nb; ++j) p[j] = _mm512_set1_ps(s[r * c + j0 + j]);
      float* acc = a.acc + r * hd;
      int64_t i = 0;
      for (; i + 32 <= hd; i += 32) {
        __m512 a0 = _mm512_loadu_ps(acc + i), a1 = _mm512_loadu_ps(acc + i + 16);
        for (int64_t j = 0; j < nb; ++j) {
          a0 = _mm512_fmadd_ps(p[j], _mm512_loadu_ps(rows + j * hd + i), a0);
          a1 = _mm512_fmadd_ps(p[j], _mm512_loadu_ps(rows + j * hd + i + 16), a1);
        }
        _mm512_storeu_ps(acc + i, a0);
        _mm512_storeu_ps(acc + i + 16, a1);
      }
      for (; i < hd; i += 16) {
        __m512 a0 = _mm512_loadu_ps(acc + i);
        for (int64_t j = 0; j < nb; ++j) a0 = _mm512_fmadd_ps(p[j], _mm512_loadu_ps(rows + j * hd + i), a0);
        _mm512_storeu_ps(acc + i, a0);
      }
    }
  }
}

}  // namespace
}  // namespace ef::x86

namespace ef {
void install_avx512_ops(KernelTable& t) {
  using namespace x86;
  const char* n = "avx512";
  t.attn_chunk[0].set(attn_chunk<false>, n);
  t.attn_chunk[1].set(attn_chunk<true>, n);
}
}  // namespace ef
