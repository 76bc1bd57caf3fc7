// AVX-512 level: the sparse FFN's down step (a sum of neurons' down columns scaled by their
// activations; also the column product of a bundle's dense FFN) as a register-tiled product. The
// outputs of a tile (up to 8 blocks of 32 for one token, 2 blocks for 4 tokens) stay in registers
// over every neuron and are stored once; each block is decoded once per tile into 32 floats
// (codes x scale) and multiplied into every token of the tile. The AVX2 level below adds each
// neuron into memory (a load, an FMA and a store per 8 outputs per neuron and token).
// Each output is the same sequence of operations in any tile: acc = 0, acc += h_i * w_i for the
// neurons in order, then out += acc, so a token's result does not depend on the batch around it.
#include <algorithm>

#include "kernel_table.h"
#include "x86_common.h"

namespace ef::x86 {
namespace {

// Decoders: block p -> the 32 weights as two vectors of 16 floats (elements 0-15, 16-31).
struct DQ8_0 {
  static constexpr size_t kBytes = 34;
  static inline void decode(const uint8_t* p, __m512& lo, __m512& hi) {
    const __m512 d = _mm512_set1_ps(h2f(p));
    lo = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 2)))));
    hi = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 18)))));
  }
};

struct DQ4_0 {  // w = d * (nibble - 8); element j: low nibble of byte j, element 16 + j: its high nibble
  static constexpr size_t kBytes = 18;
  static inline void decode(const uint8_t* p, __m512& lo, __m512& hi) {
    const float df = h2f(p);
    const __m512 d = _mm512_set1_ps(df), b = _mm512_set1_ps(-8.0f * df);
    const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 2)), m = _mm_set1_epi8(0x0F);
    lo = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_and_si128(q, m))), d, b);
    hi = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_and_si128(_mm_srli_epi16(q, 4), m))), d, b);
  }
};

struct DQ5_0 {  // w = d * ((nibble | bit j of qh << 4) - 16)
  static constexpr size_t kBytes = 22;
  static inline void decode(const uint8_t* p, __m512& lo, __m512& hi) {
    const float df = h2f(p);
    uint32_t qh;
    std::memcpy(&qh, p + 2, 4);
    const __m512 d = _mm512_set1_ps(df), b = _mm512_set1_ps(-16.0f * df);
    const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 6)), m = _mm_set1_epi8(0x0F);
    const __m512i sixteen = _mm512_set1_epi32(16);
    __m512i l = _mm512_cvtepu8_epi32(_mm_and_si128(q, m));
    __m512i h = _mm512_cvtepu8_epi32(_mm_and_si128(_mm_srli_epi16(q, 4), m));
    l = _mm512_mask_add_epi32(l, static_cast<__mmask16>(qh & 0xFFFF), l, sixteen);
    h = _mm512_mask_add_epi32(h, static_cast<__mmask16>(qh >> 16), h, sixteen);
    lo = _mm512_fmadd_ps(_mm512_cvtepi32_ps(l), d, b);
    hi = _mm512_fmadd_ps(_mm512_cvtepi32_ps(h), d, b);
  }
};

// Blocks [b0, b0 + BB) of tokens [t0, t0 + NT) over neurons [i0, i1):
// out[t, block] += sum_i h[t * cnt + i] * row_i[block]. With `ahead`, the same bytes of neuron i + ahead
// are requested while neuron i is read (the next group's rows, from DRAM in a forward pass).
template <class F, int NT, int BB>
inline void down_tile(const uint8_t* const* rows, const float* h, int64_t cnt, int64_t i0, int64_t i1, int64_t t0,
                      int64_t b0, int64_t dm, float* out, int64_t ahead, size_t pf_bytes) {
  __m512 acc[NT][2 * BB];
  for (int t = 0; t < NT; ++t)
    for (int j = 0; j < 2 * BB; ++j) acc[t][j] = _mm512_setzero_ps();
  for (int64_t i = i0; i < i1; ++i) {
    const uint8_t* p = rows[i] + static_cast<size_t>(b0) * F::kBytes;
    if (ahead && i + ahead < cnt)
      for (size_t b = 0; b < pf_bytes; b += 64) _mm_prefetch(reinterpret_cast<const char*>(rows[i + ahead]) + b, _MM_HINT_T0);
    __m512 hv[NT];
    for (int t = 0; t < NT; ++t) hv[t] = _mm512_set1_ps(h[(t0 + t) * cnt + i]);
    for (int j = 0; j < BB; ++j) {
      __m512 lo, hi;
      F::decode(p + j * F::kBytes, lo, hi);
      for (int t = 0; t < NT; ++t) {
        acc[t][2 * j] = _mm512_fmadd_ps(hv[t], lo, acc[t][2 * j]);
        acc[t][2 * j + 1] = _mm512_fmadd_ps(hv[t], hi, acc[t][2 * j + 1]);
      }
    }
  }
  for (int t = 0; t < NT; ++t)
    for (int j = 0; j < 2 * BB; ++j) {
      float* o = out + (t0 + t) * dm + 32 * b0 + 16 * j;
      _mm512_storeu_ps(o, _mm512_add_ps(_mm512_loadu_ps(o), acc[t][j]));
    }
}

constexpr int64_t kGroup = kDownGroup;  // neurons whose rows stay in L1/L2 while every tile of outputs reads them

// Tiles of BB blocks, then of BB/2, ... so every block of the outputs is covered.
template <class F, int NT, int BB>
inline void down_blocks(const uint8_t* const* rows, const float* h, int64_t cnt, int64_t i0, int64_t i1, int64_t t0,
                        int64_t b, int64_t dm, float* out, int64_t ahead, size_t pf_bytes) {
  const int64_t nb = dm / 32;
  for (; b + BB <= nb; b += BB, ahead = 0) down_tile<F, NT, BB>(rows, h, cnt, i0, i1, t0, b, dm, out, ahead, pf_bytes);
  if constexpr (BB > 1)
    if (b < nb) down_blocks<F, NT, BB / 2>(rows, h, cnt, i0, i1, t0, b, dm, out, ahead, pf_bytes);
}

// Many tokens (prefill): a group's rows are decoded once into floats (the same values the tiles
// decode on the fly), then tiles of 8 tokens x 32 outputs read them from cache: the decoding is
// not repeated for every 4 tokens.
template <int NT>
inline void float_tile(const float* w, const float* h, int64_t cnt, int64_t i0, int64_t i1, int64_t t0, int64_t c,
                       int64_t dm, float* out) {
  __m512 acc[NT][2];
  for (int t = 0; t < NT; ++t) acc[t][0] = acc[t][1] = _mm512_setzero_ps();
  for (int64_t i = i0; i < i1; ++i) {
    const float* row = w + (i - i0) * dm + c;
    const __m512 lo = _mm512_loadu_ps(row), hi = _mm512_loadu_ps(row + 16);
    for (int t = 0; t < NT; ++t) {
      const __m512 hv = _mm512_set1_ps(h[(t0 + t) * cnt + i]);
      acc[t][0] = _mm512_fmadd_ps(hv, lo, acc[t][0]);
      acc[t][1] = _mm512_fmadd_ps(hv, hi, acc[t][1]);
    }
  }
  for (int t = 0; t < NT; ++t)
    for (int j = 0; j < 2; ++j) {
      float* o = out + (t0 + t) * dm + c + 16 * j;
      _mm512_storeu_ps(o, _mm512_add_ps(_mm512_loadu_ps(o), acc[t][j]));
    }
}

template <class F>
void down_decoded(const uint8_t* const* rows, const float* h, int64_t cnt, int64_t i0, int64_t i1, int64_t n_tok,
                  int64_t dm, float* out, float* scratch) {
  float* w = scratch;  // kDownGroup * dm floats (no std container here: its instantiations would be
                       // weak symbols of an AVX-512 object, see the dispatch notes)
  for (int64_t i = i0; i < i1; ++i)
    for (int64_t b = 0; b < dm / 32; ++b) {
      __m512 lo, hi;
      F::decode(rows[i] + static_cast<size_t>(b) * F::kBytes, lo, hi);
      _mm512_storeu_ps(w + (i - i0) * dm + 32 * b, lo);
      _mm512_storeu_ps(w + (i - i0) * dm + 32 * b + 16, hi);
    }
  for (int64_t c = 0; c < dm; c += 32) {
    int64_t t = 0;
    for (; t + 8 <= n_tok; t += 8) float_tile<8>(w, h, cnt, i0, i1, t, c, dm, out);
    for (; t < n_tok; ++t) float_tile<1>(w, h, cnt, i0, i1, t, c, dm, out);
  }
}

constexpr int64_t kDecodeOnce = 16;  // tokens from which a group's rows are decoded once

template <class F>
void ffn_down_tiled(const uint8_t* const* rows, const float* h, int64_t cnt, int64_t n_tok, int64_t dm, float* out,
                    float* scratch) {
  const size_t row_part = static_cast<size_t>(dm / 32) * F::kBytes;
  for (int64_t i0 = 0; i0 < cnt; i0 += kGroup) {
    const int64_t i1 = std::min(cnt, i0 + kGroup);
    if (n_tok >= kDecodeOnce) {
      down_decoded<F>(rows, h, cnt, i0, i1, n_tok, dm, out, scratch);
      continue;
    }
    int64_t t = 0;
    for (; t + 4 <= n_tok; t += 4) down_blocks<F, 4, 2>(rows, h, cnt, i0, i1, t, 0, dm, out, t ? 0 : kGroup, row_part);
    switch (n_tok - t) {
      case 3: down_blocks<F, 3, 2>(rows, h, cnt, i0, i1, t, 0, dm, out, t ? 0 : kGroup, row_part); break;
      case 2: down_blocks<F, 2, 4>(rows, h, cnt, i0, i1, t, 0, dm, out, t ? 0 : kGroup, row_part); break;
      case 1: down_blocks<F, 1, 8>(rows, h, cnt, i0, i1, t, 0, dm, out, t ? 0 : kGroup, row_part); break;
      default: break;
    }
  }
}

}  // namespace
}  // namespace ef::x86

namespace ef {
void install_avx512_down(KernelTable& t) {
  using namespace x86;
  const char* n = "avx512";
  t.ffn_down[int(Format::q8_0)].set(ffn_down_tiled<DQ8_0>, n);
  t.ffn_down[int(Format::q4_0)].set(ffn_down_tiled<DQ4_0>, n);
  t.ffn_down[int(Format::q5_0)].set(ffn_down_tiled<DQ5_0>, n);
}
}  // namespace ef
