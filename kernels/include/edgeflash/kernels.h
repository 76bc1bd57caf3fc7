// The kernel API that the engine calls directly (no Python in the hot path). Every entry checks
// its arguments (shapes, formats, index ranges, buffer sizes it is given) and throws
// ef::KernelError on a bad call, so a caller mistake cannot make a kernel write out of bounds.
// Work is split over the shared ThreadPool; no call allocates once its scratch has grown.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "edgeflash/formats.h"
#include "edgeflash/thread_pool.h"

namespace ef {

// ---------------------------------------------------------------- weights, GEMV / small GEMM

// How a matrix's rows are stored.
//   rows:   row r starts at data + r * stride (the GGUF and bundle layout).
//   panels: groups of 16 consecutive rows ("panels", the last one padded with zero rows), each
//           block column of a panel stored field by field with the 16 rows interleaved in 4-byte
//           (2-byte for fp16 scales) lanes, q4_lut's per-row tables and nibbles in 16-byte lanes:
//           the order a SIMD GEMV consumes them in, so it reads one sequential stream and
//           transposes nothing. Same bytes per row as `rows` (docs/weight-formats.md); written by
//           pack_panels.
enum class Layout : uint8_t { rows = 0, panels = 1 };
constexpr int64_t kPanelRows = 16;

// A [rows, cols] weight matrix: row r starts at data + r * stride (stride 0 = row_bytes), or in
// the panel layout (stride must then be 0).
struct WeightMatrix {
  const uint8_t* data = nullptr;
  size_t size_bytes = 0;  // bytes readable from data; checked against rows * stride
  Format fmt = Format::f32;
  int64_t rows = 0, cols = 0;
  size_t stride = 0;
  Layout layout = Layout::rows;
};

// Bytes of a [rows, cols] matrix in the panel layout (rows rounded up to whole panels).
size_t panel_bytes(Format f, int64_t rows, int64_t cols);
// Whether `f` has a panel layout at all (the GGML quantized formats and q4_lut).
bool has_panels(Format f);
// Whether the active level runs `f` faster from panels than from rows: the engine lays such
// matrices out at load (a level without its own panel kernel still runs panels, through its twin).
bool prefers_panels(Format f);
// Rewrites a row-layout matrix into the panel layout: out holds panel_bytes(...) bytes.
void pack_panels(const WeightMatrix& w, uint8_t* out, size_t out_size);
// The rows of a panel-layout matrix back in the row layout: out holds rows * row_bytes bytes.
void unpack_panels(const WeightMatrix& w, uint8_t* out, size_t out_size);

// Activations quantized on the fly to Q8 blocks of 32 (int8 codes + one f32 scale per block,
// plus the scaled sum of each 16-element half, which folds weight offsets and minimums).
// Quantize once, reuse for every matrix that reads the same input (q/k/v, gate/up).
class QuantizedActs {
 public:
  void quantize(const float* x, int64_t n, int64_t cols);  // x: [n, cols], cols % 32 == 0
  // Bytes the buffers take for n rows of cols (what quantize allocates at most).
  static size_t bytes_for(int64_t n, int64_t cols);
  int64_t n() const { return n_; }
  int64_t cols() const { return cols_; }
  const int8_t* q() const { return q_.data(); }      // [n, cols]
  const float* d() const { return d_.data(); }       // [n, cols / 32]
  const float* s16() const { return s16_.data(); }   // [n, cols / 16]
  const float* d8() const { return d8_.data(); }     // [n, cols / 32, 8]: d repeated for vector loads
  // Integer code sums (weight code offsets are corrected in integers) and the scaled block sums.
  const int32_t* nsum16() const { return ns16_.data(); }  // [n, cols / 16]: minus the code sum of each half
  const int32_t* nsum32() const { return ns32_.data(); }  // [n, cols / 32]: minus the code sum of each block
  const float* s32() const { return s32_.data(); }        // [n, cols / 32]: d * code sum of each block

 private:
  int64_t n_ = 0, cols_ = 0;
  std::vector<int8_t> q_;
  std::vector<float> d_, s16_, d8_, s32_;
  std::vector<int32_t> ns16_, ns32_;
};

// Precision of the activations for quantized weights: q8 = ggml-style integer dot products on
// Q8 activations (fast); f32 = weights dequantized and multiplied with f32 activations (exact).
enum class ActPrecision { q8, f32 };

// y[t, r] = sum_c W[r, c] * x[t, c]   x: [n, cols] f32, y: [n, rows] f32, any n >= 1.
void matmul(const WeightMatrix& w, const float* x, int64_t n, float* y, ActPrecision prec = ActPrecision::q8);
void matmul(const WeightMatrix& w, const QuantizedActs& xq, float* y);
// Several quantized matrices with the same columns against the same activations, in one pass of
// the thread pool (q, k and v of a layer; gate and up): ys[i] = [n, ws[i].rows]. One hand-off to
// the workers instead of one per matrix, and the work split over all their rows at once.
void matmul_multi(const WeightMatrix* ws, float* const* ys, int count, const QuantizedActs& xq);
// A matrix stored by columns (row r of w holds the r-th column, `cols` values: a neuron's down
// column in a bundle's arena): y[t, :] = sum_r h[t, r] * w[r, :]   h: [n, rows], y: [n, cols] f32.
//
// `acts` f32: each column's blocks decoded to floats and scaled by h (exact up to f32 rounding).
// q8 / q8x2 (q8_0 columns where `prefers_int8_columns`): the coefficients are quantized like
// activations, per token, output block b and group of 32 rows: g_r = h[t, r] * scale_r(b), s =
// max|g| / 127, codes round(g / s) (q8x2: the residual g - s * codes quantized once more), and
// each group adds s * (its integer code dot products) to the outputs of the block with one FMA.
// The integer sums run on int8 dot-product instructions; every output is the same sequence of
// operations whatever the batch, tile or thread split, and the scalar twin computes it bit for bit.
enum class ColumnActs { f32, q8, q8x2 };
void matmul_columns(const WeightMatrix& w, const float* h, int64_t n, float* y, ColumnActs acts = ColumnActs::f32);
// Whether `fmt` columns have an int8 product at the current level (not just its scalar twin).
bool prefers_int8_columns(Format fmt);
// Column panels of q8_0 columns (rows a multiple of 32), laid out at load for the int8 product: per
// group of 32 rows, their fp16 block scales [32][blocks], then per block the codes of 4 rows at a
// time already interleaved into the lanes the product reads (8 x 128 bytes). Same size as the rows.
// matmul_columns runs a Layout::panels matrix of q8_0 with ColumnActs q8 / q8x2 only, with the
// same results as from the rows.
void pack_columns(const WeightMatrix& w, uint8_t* out, size_t out_size);
// Only the listed rows: y[t, i] = W[rows[i]] . x[t]   y: [n, n_rows] (e.g. a shortlist of the LM head).
void matmul_rows(const WeightMatrix& w, const int32_t* rows, int64_t n_rows, const float* x, int64_t n, float* y,
                 ActPrecision prec = ActPrecision::q8);

// out: [n_rows, cols] f32; rows == nullptr means all rows in order (n_rows == w.rows).
void dequantize_rows(const WeightMatrix& w, const int32_t* rows, int64_t n_rows, float* out);
// x: [rows, cols] f32 -> out: rows * row_bytes(fmt, cols) bytes. GGML rounding for the GGML
// 32-block formats; q4_lut fits 16 levels per row by 1-D k-means; q3_k fits a least-squares scale per
// 16 elements (ref_quantize.cpp). The other K-quants are not produced.
void quantize_rows(const float* x, int64_t rows, int64_t cols, Format fmt, uint8_t* out, size_t out_size);
// q4_lut with per-column importance (>= 0, e.g. E[x_j^2] of calibration activations; nullptr =
// all 1): the sensitivity-weighted fit quantize_rows runs with unit weights.
void quantize_q4_lut_rows(const float* x, int64_t rows, int64_t cols, const float* importance, uint8_t* out,
                          size_t out_size);

// ---------------------------------------------------------------- sparse FFN on a neuron arena

enum class Activation { silu = 0, gelu_tanh = 1 };

// An arena of neuron bundles: slot i holds gate row i, up row i and down column i (each a
// quantized row of d_model elements, in that order) in bytes [i * stride, i * stride + bundle).
struct NeuronArena {
  const uint8_t* data = nullptr;
  size_t size_bytes = 0;
  int64_t n_slots = 0, d_model = 0;
  Format gate = Format::q8_0, up = Format::q8_0, down = Format::q8_0;
  size_t stride = 0;  // 0 = bundle_bytes(...)
};
size_t bundle_bytes(Format gate, Format up, Format down, int64_t d_model);

// out[t] (+)= sum_{s in slots} act(gate_s . x_t) * (up_s . x_t) * down_s      x, out: [n_tok, d_model]
// With thresholds ([n_tok]), neuron s is skipped for token t when |act(gate_s . x_t)| < thresholds[t].
void ffn_sparse(const NeuronArena& arena, const float* x, int64_t n_tok, const int32_t* slots, int64_t n_active,
                Activation act, const float* thresholds, float* out, bool accumulate = false);

// ---------------------------------------------------------------- attention over a KV cache

struct RopeParams {  // RoPE as rope() applies it (below)
  int64_t rot_dim = 0;                 // even, <= head_dim; the rest of each head is left alone
  float theta_base = 10000.0f;
  const float* freq_factors = nullptr; // optional [rot_dim / 2]: frequency i is divided by it
  float linear_scale = 1.0f;           // positions are divided by it
};

// K and V take kv_key_bytes and kv_value_bytes (together kv_cache_bytes) for these arguments.
// slot_pos[capacity] holds the position stored in each slot (-1 = empty): a ring buffer works.
//   f16, q8_0: K and V are each [n_kv_heads, capacity, kv_row_bytes(fmt, head_dim)], a vector per slot.
//   kivi2 (KIVI, 2-bit codes): per KV head, a 2-bit store of `capacity` slots, then q8_0 rows: the
//     sink (positions 0..kKiviGroup-1; none in a cache that wraps) and a ring of kv_recent_slots(capacity). Keys are quantized
//     per channel over blocks of kKiviGroup positions, unrotated (KvCache::rope): an f16 mean and
//     the orthonormal Walsh-Hadamard transform of the rest on 2^b symmetric levels of an f16 step,
//     b from 0 to kKiviKeyBitsMax bits per channel, kKiviKeyBits on average, chosen per KV head
//     from its first stored block (K per head: a byte of bits per channel, then the blocks: f16
//     steps [hd], f16 means [hd], then b 32-bit words of code bits per channel); values per
//     position in groups of kKiviGroup channels (format kivi2 rows: f16 scale, f16 minimum, 8
//     bytes of codes). A position enters the ring; its block moves to the store (is sealed) once a
//     write starts kv_recent(capacity) positions past the block's last; block 0 of a cache that
//     does not wrap moves to the sink instead.
//     Position p lives in slot p % capacity (capacity a multiple of kKiviGroup); `sealed` holds
//     the first position not yet moved.
struct KvCache {
  uint8_t* k = nullptr;
  uint8_t* v = nullptr;
  size_t size_bytes = 0;  // of k, and of v unless v_size_bytes is set
  Format fmt = Format::f16;
  int64_t n_kv_heads = 0, capacity = 0, head_dim = 0;
  int32_t* slot_pos = nullptr;
  int64_t* sealed = nullptr;  // kivi2 only
  size_t v_size_bytes = 0;    // 0: size_bytes
  bool wraps = true;          // kivi2: positions may pass the capacity (a ring); if not, block 0 has no store
  RopeParams rope{};          // kivi2: the RoPE the written keys carry (rot_dim 0: none); the store keeps them unrotated
};
constexpr int64_t kKiviGroup = 32;     // positions per block, channels per value group
constexpr int64_t kKiviKeyGroup = 32;  // positions per key step and mean (one Hadamard transform)
constexpr int64_t kKiviKeyBits = 2;     // code bits per key value, on average over a head's channels
constexpr int64_t kKiviKeyBitsMax = 4;  // and at most, in one channel
constexpr int64_t kKiviRecentMin = 64;   // kv_recent's bounds
constexpr int64_t kKiviRecentMax = 256;
constexpr int64_t kKiviMaxWrite = 32;  // positions written as one run (the ring has room for them)
size_t kv_row_bytes(Format fmt, int64_t head_dim);  // f16 and q8_0
// Slots a cache of `fmt` keeps for `slots` wanted (kivi2 rounds up to whole blocks).
int64_t kv_capacity(Format fmt, int64_t slots);
// Bytes of K, of V and of both: the one count the engine allocates and its memory plan uses.
size_t kv_key_bytes(Format fmt, int64_t n_kv_heads, int64_t capacity, int64_t head_dim, bool wraps = true);
size_t kv_value_bytes(Format fmt, int64_t n_kv_heads, int64_t capacity, int64_t head_dim, bool wraps = true);
size_t kv_cache_bytes(Format fmt, int64_t n_kv_heads, int64_t capacity, int64_t head_dim, bool wraps = true);
// kivi2: positions before a decoded token it sees in q8_0 (at least): an eighth of the capacity,
// from kKiviRecentMin to kKiviRecentMax; and the ring's q8_0 rows per KV head.
int64_t kv_recent(int64_t capacity);
int64_t kv_recent_slots(int64_t capacity);
// The keys and values attention reads, as f32 [n_kv_heads, capacity, head_dim] (zeros for empty slots).
void kv_read(const KvCache& cache, float* k, float* v);

struct AttentionArgs {
  const float* q = nullptr;        // [n_q, n_heads, head_dim]
  int64_t n_q = 0, n_heads = 0;
  const int32_t* q_pos = nullptr;  // [n_q]
  int64_t window = 0;              // 0 = global; else keys with q_pos - pos >= window are hidden
  const uint8_t* mask = nullptr;   // optional [n_q, capacity], nonzero = may attend (tree ancestors)
  float scale = 1.0f;              // applied to q . k
  float softcap = 0.0f;            // 0 = none; else s = softcap * tanh(s / softcap)
  float* out = nullptr;            // [n_q, n_heads, head_dim]
};
// Key slot j is visible to query i iff slot_pos[j] >= 0, slot_pos[j] <= q_pos[i],
// (window == 0 or q_pos[i] - slot_pos[j] < window) and (mask == null or mask[i, j]).
// A query that sees no key gets a zero output row.
void attention(const KvCache& cache, const AttentionArgs& args);
// Stores k, v ([n, n_kv_heads, head_dim] f32) into slots[n] and sets slot_pos[slots[i]] = positions[i].
// kivi2: slots[i] must be positions[i] % capacity, positions at or past `sealed`, and a block is
// sealed only once all its positions were written.
void kv_write(const KvCache& cache, const float* k, const float* v, int64_t n, const int32_t* slots,
              const int32_t* positions);

// ---------------------------------------------------------------- elementwise and sampling

// y = x / sqrt(mean(x^2) + eps) * w   x, y: [n, d]; y may alias x.
void rms_norm(const float* x, const float* w, float* y, int64_t n, int64_t d, float eps);

// Rotate-half (NeoX) RoPE in place.  x: [n, n_heads, head_dim], positions: [n]
void rope(float* x, int64_t n, int64_t n_heads, int64_t head_dim, const int32_t* positions, const RopeParams& p);

// out = act(gate) * up, elementwise over count floats; out may alias gate or up.
void gated_act(const float* gate, const float* up, float* out, int64_t count, Activation act);
// Row-wise softmax. x, y: [n, d]; y may alias x.
void softmax(const float* x, float* y, int64_t n, int64_t d);
// Index of the largest value of each row (the first one on ties).  x: [n, d] -> out: [n]
void argmax(const float* x, int64_t n, int64_t d, int32_t* out);
// n floats to IEEE half, rounded to nearest even (bit-identical to f32_to_fp16 for finite values).
void to_half(const float* x, int64_t n, uint16_t* out);
// The k largest values of each row, in descending order (lower index first on ties).
// x: [n, d] -> values, indices: [n, k]
void topk(const float* x, int64_t n, int64_t d, int64_t k, float* values, int32_t* indices);

// ---------------------------------------------------------------- dispatch

struct CpuFeatures {
  std::string arch;  // "x86_64", "aarch64" or "other"
  std::vector<std::string> flags;
};
const CpuFeatures& cpu_features();
// Instruction-set levels compiled in and supported here, lowest first ("ref" is always first).
std::vector<std::string> available_isas();
// "auto" = the best available. Throws KernelError for an unknown or unsupported level.
void use_isa(const std::string& name);
std::string current_isa();
// Whether the kernels run weights of this format (storage-only formats are converted at load).
bool runs_format(Format f);
// Whether quantize_rows can write this format (K-quants but q3_k, and storage formats, are read-only).
bool can_quantize(Format f);
// (kernel name, implementation running it now) for every kernel in the dispatch table.
std::vector<std::pair<std::string, std::string>> implementations();

// Reads `bytes` of buffer with all pool threads and returns the seconds taken (bench helper).
double timed_read(const uint8_t* data, size_t bytes);

}  // namespace ef
