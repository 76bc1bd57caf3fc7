// The dispatch table: one function pointer per kernel (per weight format where relevant), each
// with the name of the instruction-set level that provides it. Levels install themselves in
// order (ref, then e.g. avx2, avx512), each overwriting the entries it implements.
#pragma once

#include <cstddef>
#include <cstdint>

#include "edgeflash/formats.h"
#include "edgeflash/kernels.h"

namespace ef {

// Rows of a weight matrix: row r is at base + (index ? index[r] : r) * stride. In the panel
// layout, panel p (rows 16p..16p+15) starts at base + 16 p stride and index is null.
struct RowsView {
  const uint8_t* base;
  size_t stride;
  const int32_t* index;
  int64_t cols;
  int64_t rows = 0;  // rows of the whole matrix (how far a kernel may prefetch); 0 = unknown
  const uint8_t* row(int64_t r) const { return base + static_cast<size_t>(index ? index[r] : r) * stride; }
  const uint8_t* panel(int64_t r) const { return base + static_cast<size_t>(r / 16 * 16) * stride; }
};

// A field of a block (or of the row header): `size` bytes at `offset`, interleaved across the 16
// rows of a panel in lanes of `lane` bytes. In a panel the field occupies bytes
// [16 * offset, 16 * (offset + size)) of its block column (the header's bytes come first), lane k
// of row i at 16 * offset + (16 * k + slot(i)) * lane. With slot(i) = i, a 4-byte-lane word at byte
// `off` of a row sits at 16 * off + 4 * i: one 64-byte vector per word of all 16 rows. `quad`
// fields (16-byte lanes) take slot(i) = 4 (i % 4) + i / 4 instead: vector a of the field holds rows
// a, 4 + a, 8 + a, 12 + a, one row per 128-bit lane (a per-row table lookup with a 16-byte shuffle).
struct Field {
  int offset, size, lane;
  bool quad = false;
};
struct PanelFields {
  int count;
  Field f[4];
  int header_count = 0;  // fields of the row header (offsets from the row start)
  Field h[2] = {};
};

// The fields of format f's block and row header in the panel layout (count 0: it has none).
PanelFields panel_fields(Format f);

// Row i (0..15) of a panel (in the panel layout) back in the row layout (panels.cpp).
void panel_row(Format f, int64_t cols, const uint8_t* panel, int i, uint8_t* row);

// Q8 activations of n tokens (see QuantizedActs).
struct Q8View {
  const int8_t* q;      // [n, cols]
  const float* d;       // [n, cols / 32]
  const float* s16;     // [n, cols / 16]
  const float* d8;      // [n, cols / 32, 8]: each scale repeated 8 times (full-width vector loads)
  const int32_t* ns16;  // [n, cols / 16]: minus the code sum of each half
  const int32_t* ns32;  // [n, cols / 32]: minus the code sum of each block
  const float* s32;     // [n, cols / 32]: d * code sum of each block
  int64_t cols;
};

inline Q8View q8_view(const QuantizedActs& a) {
  return Q8View{a.q(), a.d(), a.s16(), a.d8(), a.nsum16(), a.nsum32(), a.s32(), a.cols()};
}

// y[t * ldy + (r - r0)] for rows r in [r0, r1) and tokens t in [t0, t1). For a panel-layout
// matrix r0 is a multiple of 16 and r1 one too or the last row.
using GemmQ8Fn = void (*)(const RowsView& w, int64_t r0, int64_t r1, const Q8View& x, int64_t t0, int64_t t1,
                          float* y, int64_t ldy);
// Float weights (f32, f16) with f32 activations x: [.., cols] (row stride cols).
using GemmF32Fn = void (*)(const RowsView& w, int64_t r0, int64_t r1, const float* x, int64_t t0, int64_t t1,
                           float* y, int64_t ldy);
using DequantRowFn = void (*)(const uint8_t* row, int64_t cols, float* out);
// One row of activations -> codes q, scales d, scaled half sums s16 = d * sum16, integer half sums.
using QuantizeActsFn = void (*)(const float* x, int64_t cols, int8_t* q, float* d, float* s16, int32_t* sum16);

// Sparse-FFN down step: out[t, :] += sum_i h[t * cnt + i] * row_i for cnt quantized rows of dm
// elements (a neuron's down column). scratch: down_scratch_floats(n_tok, dm) floats (per-half offset
// sums, or a group of rows decoded once).
constexpr int64_t kDownGroup = 64;
inline size_t down_scratch_floats(int64_t n_tok, int64_t dm) {
  return static_cast<size_t>(n_tok * dm / 16 + 1 > kDownGroup * dm ? n_tok * dm / 16 + 1 : kDownGroup * dm);
}
using DownRowsFn = void (*)(const uint8_t* const* rows, const float* h, int64_t cnt, int64_t n_tok, int64_t dm,
                            float* out, float* scratch);

// matmul_columns on int8 coefficients (ColumnActs q8 / q8x2 in kernels.h): y[t, :] += the product
// of cnt columns of dm elements, with `passes` (1 or 2) int8 quantizations of h * scale per token,
// output block and group of kColumnGroup rows. scratch: columns_q8_scratch_floats(n_tok, dm, passes).
constexpr int64_t kColumnGroup = 32;
inline size_t columns_q8_scratch_floats(int64_t n_tok, int64_t dm, int passes) {
  const int64_t nbp = (dm / 32 + 15) / 16 * 16, v = n_tok * passes;  // blocks, padded to 16
  // group scales [32][nbp], packed codes [v][8][nbp] int32, coefficient scales [v][nbp]
  return static_cast<size_t>(32 * nbp + 9 * v * nbp + 16);
}
using ColumnsQ8Fn = void (*)(const uint8_t* const* rows, const float* h, int64_t cnt, int64_t n_tok, int64_t dm,
                             float* out, float* scratch, int passes);
// The same from column panels (pack_columns): blocks [b0, b0 + nbw) of `nb` per row; out: [n_tok, 32 nbw].
using ColumnsPackedFn = void (*)(const uint8_t* packed, int64_t rows, int64_t nb, int64_t b0, int64_t nbw,
                                 const float* h, int64_t n_tok, float* out, float* scratch, int passes);
// Lanes of the two int32 product registers of a block: W0 holds outputs [0-3, 16-19, 8-11, 24-27],
// W1 [4-7, 20-23, 12-15, 28-31]; kColumnLane[c] is output c's lane (16 + l: lane l of W1), the
// order two 8-bit and one 16-bit unpack stages produce (pack_columns and the AVX-512 product).
struct ColumnLanes {
  int32_t v[32];
};
constexpr ColumnLanes column_lanes() {
  ColumnLanes n{};
  constexpr int kQuadBase[4] = {0, 16, 8, 24};
  for (int l = 0; l < 16; ++l) {
    n.v[kQuadBase[l / 4] + l % 4] = l;
    n.v[kQuadBase[l / 4] + 4 + l % 4] = 16 + l;
  }
  return n;
}
alignas(64) constexpr ColumnLanes kColumnLane = column_lanes();

// One chunk of slots [0, c) of one KV head for R query rows, flash-attention style: scores,
// visibility, online softmax (running max m and sum l per row), accumulate into acc.
struct AttnChunk {
  const float* q;        // [R, hd]
  int64_t R, hd;
  const uint8_t* k;      // first key row of the chunk; rows row_bytes apart
  const uint8_t* v;
  size_t row_bytes;
  int64_t c;
  const uint8_t* vis;    // [R / group, c] nonzero = visible: row r uses vis row r / group
  int64_t group;         // query rows sharing one visibility row (the heads of a GQA group)
  float scale, softcap;
  float* m;              // [R]
  float* l;              // [R]
  float* acc;            // [R, hd]
  float* scratch;        // R * 64 + 80 * hd floats
};
using AttnChunkFn = void (*)(const AttnChunk& a);

using RmsNormFn = void (*)(const float* x, const float* w, float* y, int64_t n, int64_t d, float eps);
// x: [n, n_heads, hd]; cs: [n, rot_dim] = cos for the first half, sin for the second.
using RopeApplyFn = void (*)(float* x, int64_t n, int64_t n_heads, int64_t hd, int64_t rot_dim, const float* cs);
using GatedActFn = void (*)(const float* g, const float* u, float* y, int64_t count);
using SoftmaxFn = void (*)(const float* x, float* y, int64_t n, int64_t d);
using ArgmaxFn = int32_t (*)(const float* x, int64_t d);
// n floats to IEEE half (round to nearest even, as f32_to_fp16).
using ToHalfFn = void (*)(const float* x, int64_t n, uint16_t* out);
using TopkFn = void (*)(const float* x, int64_t d, int64_t k, float* values, int32_t* indices);

template <class Fn>
struct Entry {
  Fn fn = nullptr;
  const char* isa = "none";
  void set(Fn f, const char* name) {
    fn = f;
    isa = name;
  }
};

struct KernelTable {
  Entry<GemmQ8Fn> gemm_q8[kFormatCount];     // quantized formats
  Entry<GemmQ8Fn> gemm_q8_panels[kFormatCount];  // the same on the panel layout
  Entry<GemmF32Fn> gemm_f32[kFormatCount];   // f32, f16
  Entry<DequantRowFn> dequant[kFormatCount];
  Entry<QuantizeActsFn> quantize_acts;
  Entry<DownRowsFn> ffn_down[kFormatCount];
  Entry<ColumnsQ8Fn> columns_q8[kFormatCount];  // q8_0
  Entry<ColumnsPackedFn> columns_q8_packed[kFormatCount];  // q8_0
  Entry<AttnChunkFn> attn_chunk[2];          // [0] f16 cache, [1] q8_0 cache
  Entry<RmsNormFn> rms_norm;
  Entry<RopeApplyFn> rope_apply;
  Entry<GatedActFn> gated_act[2];            // by Activation
  Entry<SoftmaxFn> softmax;
  Entry<ArgmaxFn> argmax;
  Entry<ToHalfFn> to_half;
  Entry<TopkFn> topk;
};

// The table currently in use (never null).
const KernelTable& kernels();

// Installers, one per instruction-set level (each in its own sources and compile flags).
void install_ref(KernelTable& t);
void install_avx2(KernelTable& t);
void install_avx512(KernelTable& t);
void install_neon(KernelTable& t);
void install_neon_dotprod(KernelTable& t);
void install_neon_i8mm(KernelTable& t);

inline int attn_index(Format f) { return f == Format::q8_0 ? 1 : 0; }

}  // namespace ef
