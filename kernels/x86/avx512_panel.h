// AVX-512 VNNI quantized GEMM on 16-row panels: the 16 int32 lanes of a register are 16 weight
// rows, so one vpdpbusd multiplies 4 codes of 16 rows by 4 activation codes of one token
// (broadcast from memory), and the per-block float work (convert, scale, accumulate) is done for
// 16 rows at once instead of once per row.
//
// Weights stay in their GGML layout. A panel is decoded on the fly: the codes of each 32-element
// block ("unit") of the 16 rows are transposed into 8 registers (register g, lane i = codes
// 4g..4g+3 of row i, as unsigned bytes), and the scales of all units are gathered first into a
// small per-thread table (lane i = row i). With up to 16 tokens (two tiles) the decoded registers
// are used at once; with more, the whole panel is decoded once into per-thread scratch (L1/L2) and
// every tile of 8 tokens reads it from there, so weight decoding is amortized over all tokens.
//
// Batch invariance: every output y[t, r] is computed by the same sequence of float operations
// whatever the number of tokens, the tile a token falls in, the panel or lane a row falls in and
// the thread split: for each unit u in order (x codes q, scale dx, unit code sum S):
//     isum = sum_k c[k] q[k] - o * S             (exact int32; o = code offset, 0 if none)
//     acc  = fma(float(isum), a_u * dx, acc)     (split formats: once per 16-element half)
//     acc  = fma(b_u, dx * S, acc)               (formats with a float offset: q4_1, q4_k)
// and y = acc. Only integer sums (exact in any order) are reassociated.
#pragma once

#include <algorithm>
#include <memory>

#include "kernel_table.h"
#include "x86_common.h"

namespace ef::x86 {
namespace {

// The helpers below pass registers in small arrays; they must be inlined to stay in registers.
#define EF_INLINE inline __attribute__((always_inline))

constexpr int kPanelRows = 16;  // rows per panel = int32 lanes of a zmm register (= ef::kPanelRows)
constexpr int kTileTokens = 8;  // tokens per register tile
// How far ahead a matrix is requested: enough bytes in flight to cover DRAM latency. Measured on
// the decode sweep of Qwen2.5-Coder-1.5B's matrices (benchmarks/kernels/decode_sweep.cpp, one
// thread, CPU time): no prefetch 15 GB/s; 8-96 KiB ahead into L2 26.5-28 GB/s; into L1 12-24 KiB
// ahead 30-33 GB/s, 32-48 KiB 29 GB/s.
constexpr size_t kPrefetchBytes = 16 << 10;

// The rows of one panel in the row layout. Lanes past the last row repeat the first row, so every
// load stays inside the matrix; their results are never stored.
struct Panel {
  const uint8_t* p[kPanelRows];
};

// A panel's bytes `ahead` panels on, requested a slice per decoded step while this panel is
// computed: in a forward pass every matrix streams from DRAM, and the 16 row streams of a panel in
// the row layout defeat the hardware prefetcher.
struct Prefetch {
  const uint8_t* next = nullptr;  // null: no prefetch
  size_t slice = 0;               // bytes per step
  EF_INLINE void step(int64_t s) const {
    if (!next) return;
    const char* p = reinterpret_cast<const char*>(next) + static_cast<size_t>(s) * slice;
    for (size_t b = 0; b < slice; b += 64) _mm_prefetch(p + b, _MM_HINT_T0);
  }
};

// Per-thread scratch aligned to 64 bytes (slot 0: scale table, slot 1: decoded panel codes).
template <class T>
T* panel_scratch(size_t count, int slot) {
  thread_local std::unique_ptr<uint8_t[]> buf[2];
  thread_local size_t cap[2] = {0, 0};
  const size_t bytes = count * sizeof(T) + 64;
  if (cap[slot] < bytes) {
    buf[slot].reset(new uint8_t[bytes]);
    cap[slot] = bytes;
  }
  return reinterpret_cast<T*>((reinterpret_cast<uintptr_t>(buf[slot].get()) + 63) & ~static_cast<uintptr_t>(63));
}

typedef int32_t __attribute__((may_alias, aligned(1))) unaligned_i32;

// acc += dot4(w, the 4 activation codes at p in every lane). Written as one instruction with an
// embedded broadcast operand: the compiler would otherwise issue a separate broadcast load per
// dot product (GCC 12 does not fold it), doubling the uops of the inner loop.
EF_INLINE __m512i dot4_bcast(__m512i acc, __m512i w, const int8_t* p) {
  return _mm512_dpbusd_epi32(acc, w, _mm512_set1_epi32(*reinterpret_cast<const unaligned_i32*>(p)));
}

inline __m512i splat8(int v) { return _mm512_set1_epi8(static_cast<char>(v)); }

// ---------------------------------------------------------------- transposes of 16 rows

// 16 bytes at `off` of every row -> o[j] lane i = bytes 4j..4j+3 of row i.
EF_INLINE void transpose16x4(const Panel& P, size_t off, __m512i o[4]) {
  // z[k] holds rows k, 4+k, 8+k, 12+k in its 128-bit lanes; two unpack stages then leave dword j
  // of row 4l+k in lane 4l+k of o[j].
  __m512i z[4];
  for (int k = 0; k < 4; ++k) {
    __m512i v = _mm512_castsi128_si512(_mm_loadu_si128(reinterpret_cast<const __m128i*>(P.p[k] + off)));
    v = _mm512_inserti32x4(v, _mm_loadu_si128(reinterpret_cast<const __m128i*>(P.p[4 + k] + off)), 1);
    v = _mm512_inserti32x4(v, _mm_loadu_si128(reinterpret_cast<const __m128i*>(P.p[8 + k] + off)), 2);
    z[k] = _mm512_inserti32x4(v, _mm_loadu_si128(reinterpret_cast<const __m128i*>(P.p[12 + k] + off)), 3);
  }
  const __m512i u0 = _mm512_unpacklo_epi32(z[0], z[1]), u1 = _mm512_unpackhi_epi32(z[0], z[1]);
  const __m512i u2 = _mm512_unpacklo_epi32(z[2], z[3]), u3 = _mm512_unpackhi_epi32(z[2], z[3]);
  o[0] = _mm512_unpacklo_epi64(u0, u2);
  o[1] = _mm512_unpackhi_epi64(u0, u2);
  o[2] = _mm512_unpacklo_epi64(u1, u3);
  o[3] = _mm512_unpackhi_epi64(u1, u3);
}

// r[m] = [row lo(m) | row lo(m) + 4] (32 bytes each) with lo(m) = 8 (m / 4) + m % 4
// -> o[g] lane i = bytes 4g..4g+3 of row i. (That row placement makes the network below, two
// unpack stages and one 128-bit lane shuffle, come out in natural row order.)
EF_INLINE void transpose16x8_regs(const __m512i r[8], __m512i o[8]) {
  __m512i v[2][4];
  for (int M = 0; M < 2; ++M) {
    const __m512i lo_ab = _mm512_unpacklo_epi32(r[4 * M], r[4 * M + 1]);
    const __m512i hi_ab = _mm512_unpackhi_epi32(r[4 * M], r[4 * M + 1]);
    const __m512i lo_cd = _mm512_unpacklo_epi32(r[4 * M + 2], r[4 * M + 3]);
    const __m512i hi_cd = _mm512_unpackhi_epi32(r[4 * M + 2], r[4 * M + 3]);
    v[M][0] = _mm512_unpacklo_epi64(lo_ab, lo_cd);
    v[M][1] = _mm512_unpackhi_epi64(lo_ab, lo_cd);
    v[M][2] = _mm512_unpacklo_epi64(hi_ab, hi_cd);
    v[M][3] = _mm512_unpackhi_epi64(hi_ab, hi_cd);
  }
  for (int j = 0; j < 4; ++j) {
    o[j] = _mm512_shuffle_i32x4(v[0][j], v[1][j], _MM_SHUFFLE(2, 0, 2, 0));
    o[4 + j] = _mm512_shuffle_i32x4(v[0][j], v[1][j], _MM_SHUFFLE(3, 1, 3, 1));
  }
}

inline int t8_row(int m) { return 8 * (m >> 2) + (m & 3); }

// 32 bytes at `off` of every row (only the bytes in Mask are read; the rest are zero)
// -> o[g] lane i = bytes 4g..4g+3 of row i.
template <uint32_t Mask = 0xFFFFFFFFu>
EF_INLINE void transpose16x8(const Panel& P, size_t off, __m512i o[8]) {
  auto load = [&](const uint8_t* p) {
    if constexpr (Mask == 0xFFFFFFFFu) {
      return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    } else {
      return _mm256_maskz_loadu_epi8(Mask, p);
    }
  };
  __m512i r[8];
  for (int m = 0; m < 8; ++m) {
    const int lo = t8_row(m);
    r[m] = _mm512_inserti64x4(_mm512_castsi256_si512(load(P.p[lo] + off)), load(P.p[lo + 4] + off), 1);
  }
  transpose16x8_regs(r, o);
}

// ---------------------------------------------------------------- scale gathering

struct HalfIdx {
  uint16_t v[32];
};
// Word w -> the fp16 field of block w % 4 (fields at byte Off of blocks of BB bytes).
template <int Off, int BB>
constexpr HalfIdx field_index() {
  HalfIdx h{};
  for (int w = 0; w < 32; ++w) h.v[w] = static_cast<uint16_t>((Off + (w & 3) * BB) / 2);
  return h;
}
// Word m < 16 -> word 4 (m % 8) + j of collector m / 8 (permutex2var numbering: +32 for the second).
constexpr HalfIdx unit_index(int j) {
  HalfIdx h{};
  for (int m = 0; m < 16; ++m) h.v[m] = static_cast<uint16_t>((m < 8 ? 0 : 32) + 4 * (m & 7) + j);
  return h;
}
alignas(64) constexpr HalfIdx kUnitIdx[4] = {unit_index(0), unit_index(1), unit_index(2), unit_index(3)};

inline __m512i load_idx(const HalfIdx& h) { return _mm512_loadu_si512(h.v); }

// The fp16 field at byte Off of nb (1..4) consecutive blocks of BB bytes starting at byte `at` of
// every row -> out[j] lane i = that field of block j of row i, as float. Loads never pass the nb
// blocks. Each row's 4 fields are picked by one word permute into a 4-word slot of a collector
// register (8 rows per collector), then one permute per block gathers the 16 rows.
template <int Off, int BB>
EF_INLINE void fields16x4(const Panel& P, size_t at, int nb, __m512 out[4]) {
  static_assert(Off % 2 == 0 && BB % 2 == 0 && Off + 2 <= BB, "fp16 fields at even offsets inside the block");
  constexpr bool kTwoLoads = Off + 3 * BB + 2 > 64;
  alignas(64) static constexpr HalfIdx kIdx = field_index<Off, BB>();
  const __m512i idx = load_idx(kIdx);
  const int bytes = nb * BB;
  const __mmask64 m0 = bytes >= 64 ? ~0ull : (1ull << bytes) - 1;
  const __mmask64 m1 = bytes >= 128 ? ~0ull : bytes <= 64 ? 0ull : (1ull << (bytes - 64)) - 1;
  __m512i coll[2] = {_mm512_setzero_si512(), _mm512_setzero_si512()};
  for (int i = 0; i < kPanelRows; ++i) {
    const __mmask32 slot = 0xFu << (4 * (i & 7));
    const __m512i a = _mm512_maskz_loadu_epi8(m0, P.p[i] + at);
    if constexpr (kTwoLoads) {
      const __m512i b = _mm512_maskz_loadu_epi8(m1, P.p[i] + at + 64);
      coll[i >> 3] = _mm512_mask_mov_epi16(coll[i >> 3], slot, _mm512_permutex2var_epi16(a, idx, b));
    } else {
      coll[i >> 3] = _mm512_mask_permutexvar_epi16(coll[i >> 3], slot, idx, a);
    }
  }
  for (int j = 0; j < 4; ++j) {
    const __m512i h = _mm512_permutex2var_epi16(coll[0], load_idx(kUnitIdx[j]), coll[1]);
    out[j] = _mm512_cvtph_ps(_mm512_castsi512_si256(h));
  }
}

// ---------------------------------------------------------------- panel sources
// A format reads a panel through its source: `words4` / `words8` give 4 / 8 registers of 4-byte
// words (register j lane i = word at byte off + 4 j of row i), `halves` the fp16 field at byte Off
// of nb consecutive blocks as floats (lane i = row i). RowSource transposes rows of the GGUF
// layout; PackedSource loads the panel layout, where each of those registers is stored as it is.

struct RowSource {
  static constexpr bool kPacked = false;
  Panel P;
  EF_INLINE void words4(size_t off, __m512i o[4]) const { transpose16x4(P, off, o); }
  template <uint32_t Mask = 0xFFFFFFFFu>
  EF_INLINE void words8(size_t off, __m512i o[8]) const {
    transpose16x8<Mask>(P, off, o);
  }
  template <int Off, int BB>
  EF_INLINE void halves(size_t at, int nb, __m512 out[4]) const {
    fields16x4<Off, BB>(P, at, nb, out);
  }
  const uint8_t* row(int i) const { return P.p[i]; }
};

struct PackedSource {
  static constexpr bool kPacked = true;
  const uint8_t* base;  // the panel
  EF_INLINE const uint8_t* at(size_t off) const { return base + kPanelRows * off; }
  EF_INLINE void words4(size_t off, __m512i o[4]) const {
    for (int j = 0; j < 4; ++j) o[j] = _mm512_loadu_si512(at(off) + 64 * j);
  }
  template <uint32_t Mask = 0xFFFFFFFFu>
  EF_INLINE void words8(size_t off, __m512i o[8]) const {
    constexpr int kWords = __builtin_popcount(Mask) / 4;  // masks cover whole leading words
    for (int j = 0; j < 8; ++j) o[j] = j < kWords ? _mm512_loadu_si512(at(off) + 64 * j) : _mm512_setzero_si512();
  }
  template <int Off, int BB>
  EF_INLINE void halves(size_t first, int nb, __m512 out[4]) const {
    for (int j = 0; j < nb; ++j)
      out[j] = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(at(first + j * BB + Off))));
  }
};

// Scale table of 32-block formats for units [u0, u0 + nu):
// tab[((u - u0) * SV + slot) * 16 + i] = field at Off of block u, row i.
template <int Off, int BB, int SV, int Slot, class Src>
EF_INLINE void block_fields(const Src& P, size_t header, int64_t u0, int64_t nu, float* tab) {
  for (int64_t v = 0; v < nu; v += 4) {
    const int nb = static_cast<int>(std::min<int64_t>(4, nu - v));
    __m512 f[4];
    P.template halves<Off, BB>(header + static_cast<size_t>(u0 + v) * BB, nb, f);
    for (int j = 0; j < nb; ++j) _mm512_store_ps(tab + ((v + j) * SV + Slot) * kPanelRows, f[j]);
  }
}

EF_INLINE __m512 fp16_lanes(__m512i v) { return _mm512_cvtph_ps(_mm512_cvtepi32_epi16(v)); }

// ---------------------------------------------------------------- formats
// Each format provides:
//   kBB          bytes per block (super-block for K-quants), kHeader bytes before the first block
//   kStepUnits   32-element units decoded by one codes() call
//   kSV          scale vectors per unit in the table: a (+ b for a float offset, + a_hi if split)
//   kShift       log2 of the code offset o (the int32 sum starts at -o * S), or -1 for none
//   kFloatBias   acc += b * dx * S after each unit (offsets that are not integer multiples of a)
//   kSplit       the two 16-element halves of a unit have their own scale (q6_k)
//   scales(P, u0, nu, tab)   fills the scale table for units [u0, u0 + nu) (whole super-blocks)
//   codes(P, step, w)        w[j][g]: unsigned codes of unit step * kStepUnits + j

// The 16 nibble bytes at `off` of every row of a unit (q4_0, q4_1): low nibbles are codes 0-15,
// high nibbles codes 16-31, as unsigned bytes in the transposed register layout.
template <class Src>
EF_INLINE void nibble_codes(const Src& P, size_t off, __m512i w[8]) {
  __m512i o[4];
  P.words4(off, o);
  const __m512i m = splat8(0x0F);
  for (int j = 0; j < 4; ++j) {
    w[j] = _mm512_and_si512(o[j], m);
    w[4 + j] = _mm512_and_si512(_mm512_srli_epi32(o[j], 4), m);
  }
}

struct PQ4_0 {
  static constexpr int kBB = 18, kHeader = 0, kStepUnits = 1, kSV = 1, kShift = 3;
  static constexpr bool kFloatBias = false, kSplit = false;
  template <class Src>
  static EF_INLINE void scales(const Src& P, int64_t u0, int64_t nu, float* tab) {
    block_fields<0, kBB, kSV, 0>(P, 0, u0, nu, tab);
  }
  template <class Src>
  static EF_INLINE void codes(const Src& P, int64_t u, __m512i w[][8]) {
    nibble_codes(P, static_cast<size_t>(u) * kBB + 2, w[0]);
  }
};

struct PQ4_1 {
  static constexpr int kBB = 20, kHeader = 0, kStepUnits = 1, kSV = 2, kShift = -1;
  static constexpr bool kFloatBias = true, kSplit = false;
  template <class Src>
  static EF_INLINE void scales(const Src& P, int64_t u0, int64_t nu, float* tab) {
    block_fields<0, kBB, kSV, 0>(P, 0, u0, nu, tab);
    block_fields<2, kBB, kSV, 1>(P, 0, u0, nu, tab);
  }
  template <class Src>
  static EF_INLINE void codes(const Src& P, int64_t u, __m512i w[][8]) {
    nibble_codes(P, static_cast<size_t>(u) * kBB + 4, w[0]);
  }
};

struct PQ5_0 {
  static constexpr int kBB = 22, kHeader = 0, kStepUnits = 1, kSV = 1, kShift = 4;
  static constexpr bool kFloatBias = false, kSplit = false;
  template <class Src>
  static EF_INLINE void scales(const Src& P, int64_t u0, int64_t nu, float* tab) {
    block_fields<0, kBB, kSV, 0>(P, 0, u0, nu, tab);
  }
  template <class Src>
  static EF_INLINE void codes(const Src& P, int64_t u, __m512i w[][8]) {
    // qh (4 bytes) and the 16 nibble bytes: 20 bytes from byte 2 of the block
    __m512i o[8];
    P.template words8<0xFFFFFu>(static_cast<size_t>(u) * kBB + 2, o);
    const __m512i m = splat8(0x0F), hi = splat8(0x10);
    for (int j = 0; j < 4; ++j) {
      w[0][j] = _mm512_and_si512(o[1 + j], m);
      w[0][4 + j] = _mm512_and_si512(_mm512_srli_epi32(o[1 + j], 4), m);
    }
    // Element 4g + k takes bit 4g + k of qh, i.e. bit 4 (g % 2) + k of qh byte g / 2: copy that
    // byte to the 4 bytes of the lane, test bit k in byte k, and add 16 where it is set.
    const __m512i lane_base = _mm512_set4_epi32(0x0C0C0C0C, 0x08080808, 0x04040404, 0x00000000);
    const __m512i bit[2] = {_mm512_set1_epi32(0x08040201), _mm512_set1_epi32(static_cast<int>(0x80402010u))};
    for (int g = 0; g < 8; ++g) {
      const __m512i qb = _mm512_shuffle_epi8(o[0], _mm512_add_epi8(lane_base, splat8(g >> 1)));
      w[0][g] = _mm512_mask_add_epi8(w[0][g], _mm512_test_epi8_mask(qb, bit[g & 1]), w[0][g], hi);
    }
  }
};

struct PQ8_0 {
  static constexpr int kBB = 34, kHeader = 0, kStepUnits = 1, kSV = 1, kShift = 7;
  static constexpr bool kFloatBias = false, kSplit = false;
  template <class Src>
  static EF_INLINE void scales(const Src& P, int64_t u0, int64_t nu, float* tab) {
    block_fields<0, kBB, kSV, 0>(P, 0, u0, nu, tab);
  }
  template <class Src>
  static EF_INLINE void codes(const Src& P, int64_t u, __m512i w[][8]) {
    __m512i o[8];
    P.words8(static_cast<size_t>(u) * kBB + 2, o);
    for (int g = 0; g < 8; ++g) w[0][g] = _mm512_xor_si512(o[g], splat8(0x80));  // signed c -> c + 128
  }
};

// The row layout: each row has its own 16-level table and f32 scale; a block's scale is the
// row's times the square of its code byte.
struct PQ4_LUT {
  static constexpr int kBB = kQ4LutBlockBytes, kHeader = kQ4LutHeaderBytes, kStepUnits = 1, kSV = 1, kShift = 7;
  static constexpr bool kFloatBias = false, kSplit = false;
  static EF_INLINE void scales(const RowSource& S, int64_t u0, int64_t nu, float* tab) {
    alignas(64) float s[kPanelRows];
    for (int i = 0; i < kPanelRows; ++i) std::memcpy(&s[i], S.P.p[i], 4);
    const __m512 a = _mm512_load_ps(s);
    alignas(64) float k[kPanelRows];
    for (int64_t u = 0; u < nu; ++u) {
      const size_t off = kHeader + static_cast<size_t>(u0 + u) * kBB;
      for (int i = 0; i < kPanelRows; ++i) k[i] = static_cast<float>(S.P.p[i][off]);
      const __m512 kv = _mm512_load_ps(k);
      _mm512_store_ps(tab + u * kPanelRows, _mm512_mul_ps(a, _mm512_mul_ps(kv, kv)));
    }
  }
  static EF_INLINE void codes(const RowSource& S, int64_t u, __m512i w[][8]) {
    // Each row has its own 16-level table, so the codes are looked up row by row (two rows per
    // 256-bit shuffle, one table per 128-bit lane) before the transpose.
    const Panel& P = S.P;
    const size_t off = kHeader + static_cast<size_t>(u) * kBB + 1;
    const __m256i m = _mm256_set1_epi8(0x0F);
    __m512i r[8];
    for (int k = 0; k < 8; ++k) {
      const int lo = t8_row(k), hi = lo + 4;
      const __m256i q = _mm256_loadu2_m128i(reinterpret_cast<const __m128i*>(P.p[hi] + off),
                                            reinterpret_cast<const __m128i*>(P.p[lo] + off));
      const __m256i lut = _mm256_loadu2_m128i(reinterpret_cast<const __m128i*>(P.p[hi] + 4),
                                              reinterpret_cast<const __m128i*>(P.p[lo] + 4));
      const __m256i c0 = _mm256_shuffle_epi8(lut, _mm256_and_si256(q, m));                         // elements 0-15
      const __m256i c1 = _mm256_shuffle_epi8(lut, _mm256_and_si256(_mm256_srli_epi16(q, 4), m));  // 16-31
      // [lo 0-15, hi 0-15, lo 16-31, hi 16-31] -> [lo 0-31 | hi 0-31]
      const __m512i j = _mm512_inserti64x4(_mm512_castsi256_si512(c0), c1, 1);
      r[k] = _mm512_shuffle_i64x2(j, j, _MM_SHUFFLE(3, 1, 2, 0));
    }
    __m512i o[8];
    transpose16x8_regs(r, o);
    for (int g = 0; g < 8; ++g) w[0][g] = _mm512_xor_si512(o[g], splat8(0x80));
  }
};

// q4_k super-block (144 bytes): d, dmin (fp16), 12 bytes of 6-bit scales and minimums, then 4
// chunks of 32 bytes; chunk c holds unit 2c in its low nibbles and unit 2c + 1 in its high ones.
struct PQ4_K {
  static constexpr int kBB = 144, kHeader = 0, kStepUnits = 2, kSV = 2, kShift = -1;
  static constexpr bool kFloatBias = true, kSplit = false;
  template <class Src>
  static EF_INLINE void scales(const Src& P, int64_t u0, int64_t nu, float* tab) {
    const __m512i m6 = _mm512_set1_epi32(63), m4 = _mm512_set1_epi32(15), m2 = _mm512_set1_epi32(3);
    for (int64_t sb = u0 / 8; sb < (u0 + nu) / 8; ++sb) {
      __m512i o[4];  // o[0] = d | dmin << 16, o[1..3] = scale bytes 0-3, 4-7, 8-11
      P.words4(static_cast<size_t>(sb) * kBB, o);
      const __m512 d = fp16_lanes(o[0]);
      const __m512 nmin = _mm512_sub_ps(_mm512_setzero_ps(), fp16_lanes(_mm512_srli_epi32(o[0], 16)));
      float* t = tab + (sb - u0 / 8) * 8 * kSV * kPanelRows;
      for (int j = 0; j < 8; ++j) {
        __m512i sc, mn;
        if (j < 4) {
          sc = _mm512_and_si512(_mm512_srli_epi32(o[1], 8 * j), m6);
          mn = _mm512_and_si512(_mm512_srli_epi32(o[2], 8 * j), m6);
        } else {
          const int s = 8 * (j - 4);
          sc = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(o[3], s), m4),
                               _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(o[1], s + 6), m2), 4));
          mn = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(o[3], s + 4), m4),
                               _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(o[2], s + 6), m2), 4));
        }
        _mm512_store_ps(t + (j * kSV) * kPanelRows, _mm512_mul_ps(d, _mm512_cvtepi32_ps(sc)));
        _mm512_store_ps(t + (j * kSV + 1) * kPanelRows, _mm512_mul_ps(nmin, _mm512_cvtepi32_ps(mn)));
      }
    }
  }
  template <class Src>
  static EF_INLINE void codes(const Src& P, int64_t step, __m512i w[][8]) {
    __m512i o[8];
    P.words8(static_cast<size_t>(step / 4) * kBB + 16 + 32 * (step % 4), o);
    const __m512i m = splat8(0x0F);
    for (int g = 0; g < 8; ++g) {
      w[0][g] = _mm512_and_si512(o[g], m);
      w[1][g] = _mm512_and_si512(_mm512_srli_epi32(o[g], 4), m);
    }
  }
};

// q6_k super-block (210 bytes): ql[128] low nibbles, qh[64] 2-bit high parts, 16 int8 scales
// (one per 16 elements), d (fp16). Half h (128 elements) is units 4h + v, v = 0..3.
struct PQ6_K {
  static constexpr int kBB = 210, kHeader = 0, kStepUnits = 4, kSV = 2, kShift = 5;
  static constexpr bool kFloatBias = false, kSplit = true;
  template <class Src>
  static EF_INLINE void scales(const Src& P, int64_t u0, int64_t nu, float* tab) {
    for (int64_t sb = u0 / 8; sb < (u0 + nu) / 8; ++sb) {
      __m512i o[8];  // o[0..3]: the 16 scales, 4 per lane
      __m512 d;
      if constexpr (Src::kPacked) {
        P.words4(static_cast<size_t>(sb) * kBB + 192, o);
        __m512 h[4];
        P.template halves<208, kBB>(static_cast<size_t>(sb) * kBB, 1, h);
        d = h[0];
      } else {  // o[4]: d (18 bytes read, none past the block)
        P.template words8<0x3FFFFu>(static_cast<size_t>(sb) * kBB + 192, o);
        d = fp16_lanes(o[4]);
      }
      float* t = tab + (sb - u0 / 8) * 8 * kSV * kPanelRows;
      for (int s = 0; s < 16; ++s) {
        const __m512i v = _mm512_srai_epi32(_mm512_slli_epi32(o[s >> 2], 24 - 8 * (s & 3)), 24);
        // scale s covers elements 16 s .. 16 s + 15: unit s / 2, half s % 2
        _mm512_store_ps(t + s * kPanelRows, _mm512_mul_ps(d, _mm512_cvtepi32_ps(v)));
      }
    }
  }
  template <class Src>
  static EF_INLINE void codes(const Src& P, int64_t step, __m512i w[][8]) {
    const size_t base = static_cast<size_t>(step / 2) * kBB;
    const int h = static_cast<int>(step % 2);
    __m512i a[8], b[8], q[8];
    P.words8(base + 64 * h, a);
    P.words8(base + 64 * h + 32, b);
    P.words8(base + 128 + 32 * h, q);
    const __m512i m4 = splat8(0x0F), m2 = splat8(0x30);
    constexpr int kLowOrHigh = 0xEA;  // (A & B) | C
    for (int g = 0; g < 8; ++g) {
      w[0][g] = _mm512_ternarylogic_epi32(a[g], m4, _mm512_and_si512(_mm512_slli_epi32(q[g], 4), m2), kLowOrHigh);
      w[1][g] = _mm512_ternarylogic_epi32(b[g], m4, _mm512_and_si512(_mm512_slli_epi32(q[g], 2), m2), kLowOrHigh);
      w[2][g] = _mm512_ternarylogic_epi32(_mm512_srli_epi32(a[g], 4), m4, _mm512_and_si512(q[g], m2), kLowOrHigh);
      w[3][g] = _mm512_ternarylogic_epi32(_mm512_srli_epi32(b[g], 4), m4, _mm512_and_si512(_mm512_srli_epi32(q[g], 2), m2),
                                          kLowOrHigh);
    }
  }
};

// q3_k super-block (110 bytes): hmask[32], qs[64], 12 scale bytes, d (fp16). Half h (128
// elements) is units 4h + j, j = 0..3: 2-bit fields j of qs bytes 32h..32h+31 with bit 4h + j of
// hmask as code bit 2 (codes 0..7, offset 4).
struct PQ3_K {
  static constexpr int kBB = 110, kHeader = 0, kStepUnits = 4, kSV = 2, kShift = 2;
  static constexpr bool kFloatBias = false, kSplit = true;
  template <class Src>
  static EF_INLINE void scales(const Src& P, int64_t u0, int64_t nu, float* tab) {
    const __m512i m4 = splat8(0x0F), m2 = splat8(0x03), off = splat8(32);
    constexpr int kLowOrHigh = 0xEA;  // (A & B) | C
    for (int64_t sb = u0 / 8; sb < (u0 + nu) / 8; ++sb) {
      __m512i o[8];  // o[0..2]: the 12 scale bytes
      __m512 d;
      if constexpr (Src::kPacked) {
        P.template words8<0xFFFu>(static_cast<size_t>(sb) * kBB + 96, o);
        __m512 h[4];
        P.template halves<108, kBB>(static_cast<size_t>(sb) * kBB, 1, h);
        d = h[0];
      } else {  // o[3]: d (14 bytes read, none past the block)
        P.template words8<0x3FFFu>(static_cast<size_t>(sb) * kBB + 96, o);
        d = fp16_lanes(o[3]);
      }
      // the 16 scales + 32 as 4 words of 4 bytes (formats.h: unpack_q3_k_scales), then - 32
      __m512i s[4];
      s[0] = _mm512_ternarylogic_epi32(o[0], m4, _mm512_slli_epi32(_mm512_and_si512(o[2], m2), 4), kLowOrHigh);
      s[1] = _mm512_ternarylogic_epi32(o[1], m4, _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(o[2], 2), m2), 4),
                                       kLowOrHigh);
      s[2] = _mm512_ternarylogic_epi32(_mm512_srli_epi32(o[0], 4), m4,
                                       _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(o[2], 4), m2), 4), kLowOrHigh);
      s[3] = _mm512_ternarylogic_epi32(_mm512_srli_epi32(o[1], 4), m4,
                                       _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(o[2], 6), m2), 4), kLowOrHigh);
      for (int i = 0; i < 4; ++i) s[i] = _mm512_sub_epi8(s[i], off);
      float* t = tab + (sb - u0 / 8) * 8 * kSV * kPanelRows;
      for (int k = 0; k < 16; ++k) {
        const __m512i v = _mm512_srai_epi32(_mm512_slli_epi32(s[k >> 2], 24 - 8 * (k & 3)), 24);
        // scale k covers elements 16 k .. 16 k + 15: unit k / 2, half k % 2
        _mm512_store_ps(t + k * kPanelRows, _mm512_mul_ps(d, _mm512_cvtepi32_ps(v)));
      }
    }
  }
  // hmask bit B to bit 2 of each byte: a shift right by B - 2 (left for B < 2); 32-bit shifts by
  // at most 5 bring no other byte's bit into bit 2
  template <int B>
  static EF_INLINE __m512i high_bit(__m512i m) {
    if constexpr (B < 2) {
      return _mm512_slli_epi32(m, 2 - B);
    } else if constexpr (B == 2) {
      return m;
    } else {
      return _mm512_srli_epi32(m, B - 2);
    }
  }
  template <int H, class Src>
  static EF_INLINE void half_codes(const Src& P, size_t base, __m512i w[][8]) {
    __m512i m[8], q[8];
    P.words8(base, m);
    P.words8(base + 32 + 32 * H, q);
    const __m512i m3 = splat8(0x03), b2 = splat8(0x04);
    constexpr int kLowOrHigh = 0xEA;  // (A & B) | C
    for (int g = 0; g < 8; ++g) {
      w[0][g] = _mm512_ternarylogic_epi32(q[g], m3, _mm512_and_si512(high_bit<4 * H>(m[g]), b2), kLowOrHigh);
      w[1][g] = _mm512_ternarylogic_epi32(_mm512_srli_epi32(q[g], 2), m3, _mm512_and_si512(high_bit<4 * H + 1>(m[g]), b2),
                                          kLowOrHigh);
      w[2][g] = _mm512_ternarylogic_epi32(_mm512_srli_epi32(q[g], 4), m3, _mm512_and_si512(high_bit<4 * H + 2>(m[g]), b2),
                                          kLowOrHigh);
      w[3][g] = _mm512_ternarylogic_epi32(_mm512_srli_epi32(q[g], 6), m3, _mm512_and_si512(high_bit<4 * H + 3>(m[g]), b2),
                                          kLowOrHigh);
    }
  }
  template <class Src>
  static EF_INLINE void codes(const Src& P, int64_t step, __m512i w[][8]) {
    const size_t base = static_cast<size_t>(step / 2) * kBB;
    if (step % 2) {
      half_codes<1>(P, base, w);
    } else {
      half_codes<0>(P, base, w);
    }
  }
};

// ---------------------------------------------------------------- the tile kernel

// Activation pointers of NT consecutive tokens.
template <int NT>
struct Tokens {
  const int8_t* q[NT];
  const float* d[NT];
  const int32_t* ns[NT];  // minus code sums: per half for split formats, per block otherwise
  const float* s32[NT];
  Tokens(const Q8View& x, int64_t t0, bool split) {
    const int64_t cols = x.cols;
    for (int t = 0; t < NT; ++t) {
      q[t] = x.q + (t0 + t) * cols;
      d[t] = x.d + (t0 + t) * (cols / 32);
      ns[t] = split ? x.ns16 + (t0 + t) * (cols / 16) : x.ns32 + (t0 + t) * (cols / 32);
      s32[t] = x.s32 + (t0 + t) * (cols / 32);
    }
  }
};

template <class F>
EF_INLINE __m512i sum_start(int32_t neg_sum) {
  if constexpr (F::kShift >= 0) {
    return _mm512_slli_epi32(_mm512_set1_epi32(neg_sum), F::kShift);
  } else {
    return _mm512_setzero_si512();
  }
}

// One unit of the panel (codes w, scale vectors tab) against NT tokens: the fixed per-output
// sequence described at the top of this file.
template <class F, int NT>
EF_INLINE void unit_tokens(const __m512i w[8], const float* tab, const Tokens<NT>& x, int64_t u, __m512 acc[NT]) {
  const __m512 a = _mm512_load_ps(tab);
  if constexpr (F::kSplit) {
    const __m512 a_hi = _mm512_load_ps(tab + kPanelRows);
    __m512i lo[NT], hi[NT];
    for (int t = 0; t < NT; ++t) {
      lo[t] = sum_start<F>(x.ns[t][2 * u]);
      hi[t] = sum_start<F>(x.ns[t][2 * u + 1]);
    }
    for (int g = 0; g < 4; ++g)
      for (int t = 0; t < NT; ++t) {
        lo[t] = dot4_bcast(lo[t], w[g], x.q[t] + 32 * u + 4 * g);
        hi[t] = dot4_bcast(hi[t], w[4 + g], x.q[t] + 32 * u + 16 + 4 * g);
      }
    for (int t = 0; t < NT; ++t) {
      const __m512 dx = _mm512_set1_ps(x.d[t][u]);
      acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(lo[t]), _mm512_mul_ps(a, dx), acc[t]);
      acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(hi[t]), _mm512_mul_ps(a_hi, dx), acc[t]);
    }
  } else {
    __m512i s[NT];
    for (int t = 0; t < NT; ++t) s[t] = sum_start<F>(x.ns[t][u]);
    if constexpr (NT <= 2) {
      // Few tokens: two chains of 4 products instead of one of 8 (integer sums: the same result).
      __m512i s2[NT];
      for (int t = 0; t < NT; ++t) s2[t] = _mm512_setzero_si512();
      for (int g = 0; g < 8; g += 2)
        for (int t = 0; t < NT; ++t) {
          s[t] = dot4_bcast(s[t], w[g], x.q[t] + 32 * u + 4 * g);
          s2[t] = dot4_bcast(s2[t], w[g + 1], x.q[t] + 32 * u + 4 * g + 4);
        }
      for (int t = 0; t < NT; ++t) s[t] = _mm512_add_epi32(s[t], s2[t]);
    } else {
      for (int g = 0; g < 8; ++g)
        for (int t = 0; t < NT; ++t) s[t] = dot4_bcast(s[t], w[g], x.q[t] + 32 * u + 4 * g);
    }
    for (int t = 0; t < NT; ++t) {
      acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s[t]), _mm512_mul_ps(a, _mm512_set1_ps(x.d[t][u])), acc[t]);
      if constexpr (F::kFloatBias)
        acc[t] = _mm512_fmadd_ps(_mm512_load_ps(tab + kPanelRows), _mm512_set1_ps(x.s32[t][u]), acc[t]);
    }
  }
}

template <int NT>
EF_INLINE void store_tile(const __m512 acc[NT], float* y, int64_t t0, int64_t ldy, __mmask16 valid) {
  for (int t = 0; t < NT; ++t) _mm512_mask_storeu_ps(y + (t0 + t) * ldy, valid, acc[t]);
}

// Units whose scales are decoded together on the GEMV path: one K-quant super-block, or 8 blocks
// (two gathers of 4): a small table that stays in L1, read right after the bytes it came from.
constexpr int kGroupUnits = 8;

// Activation rows a panel is decoded for once and used at once: three tiles. The later tiles'
// accumulators do not all fit in registers, but spilling them costs less than decoding the panel
// into scratch and reading it back per tile (panel_packed: on an 8960 x 1536 matrix 9 rows cost 1.4x
// what 8 do that way, 1.03-1.08x this way). With q8x2 activations (two rows a token) the third tile
// is what a verification pass of 9-12 nodes needs: Qwen2.5-Coder-1.5B's pass of 9 nodes costs 2.7
// plain steps this way and 3.2 through scratch, 12 nodes 3.5 and 3.8 (verify_cost.py's passes). With
// four tiles the spills cost more than the scratch.
constexpr int kDirectTokens = 3 * kTileTokens;

constexpr int tile_size(int nt, int k) { return std::clamp(nt - k * kTileTokens, 0, kTileTokens); }

// Up to kDirectTokens rows: decode each step of units and use it at once for every tile,
// scales a group at a time.
template <class F, int NT, class Src>
void panel_direct(const Src& P, int64_t nu, const Q8View& x, int64_t t0, float* y, int64_t ldy, __mmask16 valid,
                  const Prefetch& pf) {
  static_assert(kGroupUnits % F::kStepUnits == 0, "a group holds whole steps");
  static_assert(NT <= kDirectTokens, "at most kDirectTokens");
  constexpr int N0 = tile_size(NT, 0), N1 = tile_size(NT, 1), N2 = tile_size(NT, 2);
  const Tokens<N0> tk0(x, t0, F::kSplit);
  const Tokens<std::max(N1, 1)> tk1(x, t0 + kTileTokens, F::kSplit);  // only pointers: unread when N1 = 0
  const Tokens<std::max(N2, 1)> tk2(x, t0 + 2 * kTileTokens, F::kSplit);
  alignas(64) float tab[kGroupUnits * F::kSV * kPanelRows];
  __m512 acc[NT];
  for (int t = 0; t < NT; ++t) acc[t] = _mm512_setzero_ps();
  for (int64_t g0 = 0; g0 < nu; g0 += kGroupUnits) {
    const int64_t gn = std::min<int64_t>(kGroupUnits, nu - g0);
    F::scales(P, g0, gn, tab);
    for (int64_t step = g0 / F::kStepUnits; step < (g0 + gn) / F::kStepUnits; ++step) {
      pf.step(step);
      __m512i w[F::kStepUnits][8];
      F::codes(P, step, w);
      for (int j = 0; j < F::kStepUnits; ++j) {
        const int64_t u = step * F::kStepUnits + j;
        const float* scales = tab + (u - g0) * F::kSV * kPanelRows;
        unit_tokens<F, N0>(w[j], scales, tk0, u, acc);
        if constexpr (N1 > 0) unit_tokens<F, N1>(w[j], scales, tk1, u, acc + kTileTokens);
        if constexpr (N2 > 0) unit_tokens<F, N2>(w[j], scales, tk2, u, acc + 2 * kTileTokens);
      }
    }
  }
  store_tile<NT>(acc, y, t0, ldy, valid);
}

// One tile of tokens over a panel decoded into `codes` ([nu][8] registers).
template <class F, int NT>
void panel_tile(const __m512i* codes, int64_t nu, const float* tab, const Q8View& x, int64_t t0, float* y,
                int64_t ldy, __mmask16 valid) {
  const Tokens<NT> tk(x, t0, F::kSplit);
  __m512 acc[NT];
  for (int t = 0; t < NT; ++t) acc[t] = _mm512_setzero_ps();
  for (int64_t u = 0; u < nu; ++u) {
    __m512i w[8];
    for (int g = 0; g < 8; ++g) w[g] = _mm512_load_si512(codes + 8 * u + g);
    unit_tokens<F, NT>(w, tab + u * F::kSV * kPanelRows, tk, u, acc);
  }
  store_tile<NT>(acc, y, t0, ldy, valid);
}

// Tokens [t0, t1) in tiles over a panel decoded into `codes` and `tab`.
template <class F>
void panel_tiles(const __m512i* codes, int64_t nu, const float* tab, const Q8View& x, int64_t t0, int64_t t1,
                 float* y, int64_t ldy, __mmask16 valid) {
  int64_t t = t0;
  for (; t + kTileTokens <= t1; t += kTileTokens) panel_tile<F, kTileTokens>(codes, nu, tab, x, t, y, ldy, valid);
  switch (t1 - t) {
    case 1: panel_tile<F, 1>(codes, nu, tab, x, t, y, ldy, valid); break;
    case 2: panel_tile<F, 2>(codes, nu, tab, x, t, y, ldy, valid); break;
    case 3: panel_tile<F, 3>(codes, nu, tab, x, t, y, ldy, valid); break;
    case 4: panel_tile<F, 4>(codes, nu, tab, x, t, y, ldy, valid); break;
    case 5: panel_tile<F, 5>(codes, nu, tab, x, t, y, ldy, valid); break;
    case 6: panel_tile<F, 6>(codes, nu, tab, x, t, y, ldy, valid); break;
    case 7: panel_tile<F, 7>(codes, nu, tab, x, t, y, ldy, valid); break;
    default: break;
  }
}

// More than kDirectTokens rows: decode the whole panel once (scales and codes) and run every tile of
// tokens over it from L1/L2.
template <class F, class Src>
void panel_packed(const Src& P, int64_t nu, float* tab, __m512i* codes, const Q8View& x, int64_t t0, int64_t t1,
                  float* y, int64_t ldy, __mmask16 valid, const Prefetch& pf) {
  F::scales(P, 0, nu, tab);
  for (int64_t step = 0; step < nu / F::kStepUnits; ++step) {
    pf.step(step);
    __m512i w[F::kStepUnits][8];
    F::codes(P, step, w);
    for (int j = 0; j < F::kStepUnits; ++j)
      for (int g = 0; g < 8; ++g) _mm512_store_si512(codes + 8 * (step * F::kStepUnits + j) + g, w[j][g]);
  }
  panel_tiles<F>(codes, nu, tab, x, t0, t1, y, ldy, valid);
}

// panel_direct for the NT in [N, kDirectTokens] that equals nt.
template <class F, class Src, int N = 1>
void panel_direct_n(int64_t nt, const Src& P, int64_t nu, const Q8View& x, int64_t t0, float* y, int64_t ldy,
                    __mmask16 valid, const Prefetch& pf) {
  if (nt == N) {
    panel_direct<F, N>(P, nu, x, t0, y, ldy, valid, pf);
  } else if constexpr (N < kDirectTokens) {
    panel_direct_n<F, Src, N + 1>(nt, P, nu, x, t0, y, ldy, valid, pf);
  }
}

template <class F, class Src>
void run_panel(const Src& P, int64_t nu, float* tab, __m512i* codes, const Q8View& x, int64_t t0, int64_t t1,
               float* yp, int64_t ldy, __mmask16 vm, const Prefetch& pf) {
  if (t1 - t0 <= kDirectTokens) {
    panel_direct_n<F>(t1 - t0, P, nu, x, t0, yp, ldy, vm, pf);
  } else {
    panel_packed<F>(P, nu, tab, codes, x, t0, t1, yp, ldy, vm, pf);
  }
}

// Rows [r0, r1) in panels of 16: panel(p0, valid, vm, yp, pf) computes the panel at row p0 (valid
// rows of it, lane mask vm, outputs from yp) with pf requesting, a slice per step (`steps` per
// panel), the bytes `distance` on in the matrix. Every matrix is prefetched ahead of the panel being
// computed: in a model's forward pass each matrix is read once and streams from DRAM, whatever its
// size. The distance is whole panels up to kPrefetchBytes, and kPrefetchBytes itself within the
// stream when one panel is larger (a down projection's 16 rows of 4864-18944 columns are 30-160
// KiB): a whole such panel ahead would overrun L1 before its lines are used.
template <class PanelFn>
void for_each_panel(const RowsView& w, int64_t r0, int64_t r1, int64_t steps, float* y, const PanelFn& panel) {
  const size_t panel_span = kPanelRows * w.stride;
  const int64_t rows = w.rows > 0 ? w.rows : r1;
  Prefetch pf;
  pf.slice = (panel_span / static_cast<size_t>(steps) + 63) & ~static_cast<size_t>(63);
  const int64_t ahead = std::clamp<int64_t>(static_cast<int64_t>(kPrefetchBytes / panel_span), 1, 8);
  const size_t distance = panel_span > kPrefetchBytes ? kPrefetchBytes : static_cast<size_t>(ahead) * panel_span;
  const char* end = reinterpret_cast<const char*>(w.panel(0)) + static_cast<size_t>(rows) * w.stride;
  // The bytes the loop's prefetch never requests (it runs `distance` on) are requested now: a
  // decode GEMV is split into tasks of a few dozen KiB, and their first panels would otherwise each
  // wait out a full DRAM latency.
  if (!w.index) {
    const char* start = reinterpret_cast<const char*>(w.panel(r0));
    const size_t first = std::min(distance, static_cast<size_t>(end - start));
    for (size_t b = 0; b < first; b += 64) _mm_prefetch(start + b, _MM_HINT_T0);
  }
  for (int64_t p0 = r0; p0 < r1; p0 += kPanelRows) {
    const char* ahead_of = reinterpret_cast<const char*>(w.panel(p0)) + distance;
    const bool more = !w.index && ahead_of + panel_span <= end;
    pf.next = more ? reinterpret_cast<const uint8_t*>(ahead_of) : nullptr;
    const int valid = static_cast<int>(std::min<int64_t>(kPanelRows, r1 - p0));
    panel(p0, valid, static_cast<__mmask16>((1u << valid) - 1), y + (p0 - r0), pf);
  }
}

// Rows [r0, r1), tokens [t0, t1); Packed: the panel layout, else the row layout.
template <class F, bool Packed>
void gemm_panels(const RowsView& w, int64_t r0, int64_t r1, const Q8View& x, int64_t t0, int64_t t1, float* y,
                 int64_t ldy) {
  const int64_t nu = w.cols / 32, nt = t1 - t0;
  const bool packed = nt > kDirectTokens;  // run_panel's choice
  float* tab = packed ? panel_scratch<float>(static_cast<size_t>(nu * F::kSV * kPanelRows), 0) : nullptr;
  __m512i* codes = packed ? panel_scratch<__m512i>(static_cast<size_t>(nu * 8), 1) : nullptr;
  for_each_panel(w, r0, r1, nu / F::kStepUnits, y,
                 [&](int64_t p0, int valid, __mmask16 vm, float* yp, const Prefetch& pf) {
                   if constexpr (Packed) {
                     run_panel<F>(PackedSource{w.panel(p0)}, nu, tab, codes, x, t0, t1, yp, ldy, vm, pf);
                   } else {
                     RowSource src;
                     for (int i = 0; i < kPanelRows; ++i) src.P.p[i] = w.row(i < valid ? p0 + i : p0);
                     run_panel<F>(src, nu, tab, codes, x, t0, t1, yp, ldy, vm, pf);
                   }
                 });
}

template <class F>
void gemm_q8_panels(const RowsView& w, int64_t r0, int64_t r1, const Q8View& x, int64_t t0, int64_t t1, float* y,
                    int64_t ldy) {
  gemm_panels<F, false>(w, r0, r1, x, t0, t1, y, ldy);
}

template <class F>
void gemm_q8_packed(const RowsView& w, int64_t r0, int64_t r1, const Q8View& x, int64_t t0, int64_t t1, float* y,
                    int64_t ldy) {
  gemm_panels<F, true>(w, r0, r1, x, t0, t1, y, ldy);
}

}  // namespace
}  // namespace ef::x86
