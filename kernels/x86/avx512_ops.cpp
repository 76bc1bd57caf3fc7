// AVX-512 level: the attention chunk as two register-tiled products (scores = Q K^T from K
// transposed to [head_dim, slot], then P V from the V rows), 16 slots or head_dim columns per
// register and 4 query rows per tile, with the online softmax in between.
#include <algorithm>
#include <cmath>
#include <limits>

#include "kernel_table.h"
#include "x86_common.h"

namespace ef::x86 {
namespace {

// Slot rows of a chunk as f32: rows [c, hd] (V), or transposed kt [hd, 64] (K: column j = slot j,
// columns c..63 zero), so both products are outer products with nothing to reduce horizontally.
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

// 16 x 16 floats: in[i] row i -> out row i = column i.
inline void transpose16(__m512 r[16]) {
  __m512 t[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {
    r[i] = _mm512_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(1, 0, 1, 0));
    r[i + 1] = _mm512_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(3, 2, 3, 2));
    r[i + 2] = _mm512_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(1, 0, 1, 0));
    r[i + 3] = _mm512_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  for (int i = 0; i < 4; ++i) {  // 128-bit lanes: rows 4g + i of each quarter
    t[i] = _mm512_shuffle_f32x4(r[i], r[4 + i], 0x88);
    t[4 + i] = _mm512_shuffle_f32x4(r[i], r[4 + i], 0xDD);
    t[8 + i] = _mm512_shuffle_f32x4(r[8 + i], r[12 + i], 0x88);
    t[12 + i] = _mm512_shuffle_f32x4(r[8 + i], r[12 + i], 0xDD);
  }
  for (int i = 0; i < 4; ++i) {
    r[i] = _mm512_shuffle_f32x4(t[i], t[8 + i], 0x88);
    r[8 + i] = _mm512_shuffle_f32x4(t[i], t[8 + i], 0xDD);
    r[4 + i] = _mm512_shuffle_f32x4(t[4 + i], t[12 + i], 0x88);
    r[12 + i] = _mm512_shuffle_f32x4(t[4 + i], t[12 + i], 0xDD);
  }
}

constexpr int kSlots = 64;  // columns of kt (attention.cpp's chunk)

// rows: 16 * hd floats of staging.
template <bool Q8>
void k_transposed(const AttnChunk& a, float* kt, float* rows) {
  const int64_t hd = a.hd, c = a.c;
  for (int64_t j0 = 0; j0 < kSlots; j0 += 16) {
    for (int64_t j = 0; j < 16; ++j) {
      if (j0 + j < c) {
        kv_row<Q8>(a.k + (j0 + j) * a.row_bytes, hd, rows + j * hd);
      } else {
        for (int64_t i = 0; i < hd; i += 16) _mm512_storeu_ps(rows + j * hd + i, _mm512_setzero_ps());
      }
    }
    for (int64_t d0 = 0; d0 < hd; d0 += 16) {
      __m512 r[16];
      for (int j = 0; j < 16; ++j) r[j] = _mm512_loadu_ps(rows + j * hd + d0);
      transpose16(r);
      for (int i = 0; i < 16; ++i) _mm512_storeu_ps(kt + (d0 + i) * kSlots + j0, r[i]);
    }
  }
}

// e^x, 16 wide (the polynomial of exp8); inputs clamped to [-87.3, 88.7].
inline __m512 exp16(__m512 x) {
  x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.3f)), _mm512_set1_ps(88.7f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  const __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
  return _mm512_mul_ps(p, _mm512_castsi512_ps(e));
}

// Scores of rows [r0, r0 + NR) against the chunk's 64 slot columns: s = scale * q . k, hidden
// slots -inf. Each row's sums run over head_dim in order, whatever the tile it falls in.
template <int NR>
inline void score_tile(const AttnChunk& a, const float* kt, int64_t r0, float* s) {
  const int64_t hd = a.hd, c = a.c;
  __m512 acc[NR][4];
  for (int r = 0; r < NR; ++r)
    for (int k = 0; k < 4; ++k) acc[r][k] = _mm512_setzero_ps();
  const float* q = a.q + r0 * hd;
  for (int64_t d = 0; d < hd; ++d) {
    const __m512 k0 = _mm512_loadu_ps(kt + d * kSlots), k1 = _mm512_loadu_ps(kt + d * kSlots + 16);
    const __m512 k2 = _mm512_loadu_ps(kt + d * kSlots + 32), k3 = _mm512_loadu_ps(kt + d * kSlots + 48);
    for (int r = 0; r < NR; ++r) {
      const __m512 qv = _mm512_set1_ps(q[r * hd + d]);
      acc[r][0] = _mm512_fmadd_ps(qv, k0, acc[r][0]);
      acc[r][1] = _mm512_fmadd_ps(qv, k1, acc[r][1]);
      acc[r][2] = _mm512_fmadd_ps(qv, k2, acc[r][2]);
      acc[r][3] = _mm512_fmadd_ps(qv, k3, acc[r][3]);
    }
  }
  const __m512 sc = _mm512_set1_ps(a.scale), ninf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  for (int r = 0; r < NR; ++r) {
    const uint8_t* vis = a.vis + ((r0 + r) / a.group) * c;
    float* sr = s + (r0 + r) * kSlots;
    for (int k = 0; k < 4; ++k) {
      const int64_t j0 = 16 * k;
      const int n = static_cast<int>(std::max<int64_t>(0, std::min<int64_t>(16, c - j0)));
      const __m128i v = _mm_maskz_loadu_epi8(static_cast<__mmask16>((1u << n) - 1), vis + j0);
      const __mmask16 visible = _mm_test_epi8_mask(v, v);
      _mm512_storeu_ps(sr + j0, _mm512_mask_mul_ps(ninf, visible, acc[r][k], sc));
    }
  }
}

// acc rows [r0, r0 + NR) += p . V over the chunk's slots, head_dim columns [d0, d0 + 16 ND).
// The pass over the first columns (kSum) also adds each row's probabilities to its l, one slot
// after another (hidden slots add an exact 0): a query's sum then depends on the keys it sees, not
// on the slots between them (a speculative tree's ancestors are not adjacent; in plain decoding
// they are), whereas 16 lanes would group the keys by slot. Done here, the serial adds of a few
// rows overlap the tile's multiply-adds instead of stalling the softmax one row at a time.
template <int NR, int ND, bool kSum>
inline void value_tile(const AttnChunk& a, const float* vrows, const float* s, int64_t r0, int64_t d0) {
  const int64_t hd = a.hd, c = a.c;
  __m512 acc[NR][ND];
  float sum[NR] = {};
  for (int r = 0; r < NR; ++r)
    for (int k = 0; k < ND; ++k) acc[r][k] = _mm512_loadu_ps(a.acc + (r0 + r) * hd + d0 + 16 * k);
  for (int64_t j = 0; j < c; ++j) {
    __m512 v[ND];
    for (int k = 0; k < ND; ++k) v[k] = _mm512_loadu_ps(vrows + j * hd + d0 + 16 * k);
    for (int r = 0; r < NR; ++r) {
      const float pr = s[(r0 + r) * kSlots + j];
      if (kSum) sum[r] += pr;
      const __m512 p = _mm512_set1_ps(pr);
      for (int k = 0; k < ND; ++k) acc[r][k] = _mm512_fmadd_ps(p, v[k], acc[r][k]);
    }
  }
  for (int r = 0; r < NR; ++r)
    for (int k = 0; k < ND; ++k) _mm512_storeu_ps(a.acc + (r0 + r) * hd + d0 + 16 * k, acc[r][k]);
  if (kSum)
    for (int r = 0; r < NR; ++r) a.l[r0 + r] += sum[r];
}

template <int ND, bool kSum>
inline void value_rows(const AttnChunk& a, const float* vrows, const float* s, int64_t d0) {
  int64_t r = 0;
  for (; r + 4 <= a.R; r += 4) value_tile<4, ND, kSum>(a, vrows, s, r, d0);
  for (; r < a.R; ++r) value_tile<1, ND, kSum>(a, vrows, s, r, d0);
}

// Attention over one chunk of up to 64 slots for R query rows, as two small GEMMs: scores
// [R, 64] = Q K^T from the transposed K block, then acc += P V from the V rows, with the online
// softmax in between. Rows go 4 at a time (the rest 1 at a time): a row's arithmetic is the same
// in any tile, so a row's result never depends on the other rows of the call.
template <bool Q8>
void attn_chunk(const AttnChunk& a) {
  const int64_t R = a.R, hd = a.hd, c = a.c;
  float* s = a.scratch;                  // [R, 64] scores, then probabilities
  float* kv = a.scratch + R * kSlots;    // [hd, 64] K transposed, then [c, hd] V rows
  const float ninf = -std::numeric_limits<float>::infinity();
  k_transposed<Q8>(a, kv, kv + kSlots * hd);  // staged through the 16 rows after it
  int64_t r = 0;
  for (; r + 4 <= R; r += 4) score_tile<4>(a, kv, r, s);
  for (; r < R; ++r) score_tile<1>(a, kv, r, s);
  bool any_row = false;
  for (int64_t i = 0; i < R; ++i) {
    float* sr = s + i * kSlots;
    if (a.softcap > 0.0f)
      for (int64_t j = 0; j < c; ++j)
        if (sr[j] != ninf) sr[j] = a.softcap * std::tanh(sr[j] / a.softcap);
    __m512 mv = _mm512_set1_ps(a.m[i]);  // slots past c hold -inf
    for (int64_t j0 = 0; j0 < kSlots; j0 += 16) mv = _mm512_max_ps(mv, _mm512_loadu_ps(sr + j0));
    const float mx = _mm512_reduce_max_ps(mv);
    if (mx == ninf) {  // nothing visible yet: no weight for any slot
      for (int64_t j = 0; j < kSlots; ++j) sr[j] = 0.0f;
      continue;
    }
    any_row = true;
    const float corr = a.m[i] == ninf ? 0.0f : std::exp(a.m[i] - mx);
    for (int64_t j0 = 0; j0 < kSlots; j0 += 16) {
      const __m512 v = _mm512_loadu_ps(sr + j0);
      const __mmask16 live = _mm512_cmp_ps_mask(v, _mm512_set1_ps(ninf), _CMP_NEQ_OQ);
      _mm512_storeu_ps(sr + j0, _mm512_maskz_mov_ps(live, exp16(_mm512_sub_ps(v, _mm512_set1_ps(mx)))));
    }
    a.l[i] *= corr;  // the value pass adds this chunk's probabilities
    a.m[i] = mx;
    if (corr != 1.0f) {
      const __m512 cv = _mm512_set1_ps(corr);
      float* acc = a.acc + i * hd;
      for (int64_t d = 0; d < hd; d += 16) _mm512_storeu_ps(acc + d, _mm512_mul_ps(cv, _mm512_loadu_ps(acc + d)));
    }
  }
  if (!any_row) return;
  for (int64_t j = 0; j < c; ++j) kv_row<Q8>(a.v + j * a.row_bytes, hd, kv + j * hd);
  // head_dim is a multiple of 16: the first pass (which sums) covers 64 columns or all of them.
  int64_t d0 = 0;
  if (hd >= 64) value_rows<4, true>(a, kv, s, 0), d0 = 64;
  else value_rows<1, true>(a, kv, s, 0), d0 = 16;
  for (; d0 + 64 <= hd; d0 += 64) value_rows<4, false>(a, kv, s, d0);
  for (; d0 < hd; d0 += 16) value_rows<1, false>(a, kv, s, d0);
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
