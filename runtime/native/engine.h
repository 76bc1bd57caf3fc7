// The native decoder: one call runs a whole forward pass (embedding, every block, head) over
// the kernels, so a decode step costs one Python -> C++ crossing. It executes any model the
// spec flags describe (llama and gemma3 families); the numpy reference runtime is its oracle.
//
// Weights are borrowed: the caller keeps every buffer alive (the Python wrapper holds them).
// Per-layer weights come from a LayerSource (memory/native/layer_source.h), so they may be
// resident or arrive from flash.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "edgeflash/kernels.h"
#include "layer_source.h"
#include "op_profile.h"

namespace ef::engine {

struct ModelShape {
  int64_t n_layers = 0, d_model = 0, n_heads = 0, n_kv_heads = 0, head_dim = 0, d_ff = 0, vocab = 0;
  float norm_eps = 1e-6f;
  float embedding_scale = 1.0f;
  float attn_scale = 1.0f;
  float final_softcap = 0.0f;
  Activation act = Activation::silu;
  bool qk_norm = false;
  bool sandwich_norm = false;  // Gemma: norms after attention and after the FFN
  // Tensor parallelism: the embedding and head rows this engine holds, [vocab_begin, vocab_end) of
  // the vocabulary (0, 0: all of it). n_heads, n_kv_heads and d_ff are then this rank's share, and
  // a PartialSums completes what each rank computes (Engine::set_partial_sums).
  int64_t vocab_begin = 0, vocab_end = 0;
};

struct LayerShape {
  int64_t window = 0;              // 0 = global attention
  int64_t rot_dim = 0;
  std::vector<float> freq_factors; // [rot_dim / 2], with theta_base reproduces the layer's inv_freq
  float theta_base = 10000.0f;
};

// How activations meet quantized weights.
//   q8:   ggml-style Q8 blocks of 32 and integer dot products (fastest; ~1% relative error per
//         matmul, enough to flip near-tied top-1 tokens a few percent of the time).
//   q8x2: the Q8 blocks plus a second Q8 pass over their rounding residual, run as extra rows
//         of the same small GEMM, so each weight byte is still read once; about 16-bit accuracy.
//   f32:  weights dequantized to f32 (exact, slowest).
enum class ActMode { q8, q8x2, f32 };

struct EngineOptions {
  int64_t context = 4096;     // positions the cache can hold (global layers)
  int64_t max_batch = 64;     // tokens per forward call (prefill chunk, verification tree)
  Format kv_format = Format::f16;
  ActMode act_mode = ActMode::q8x2;
  int64_t head_chunk = 16384;  // head rows per logits pass: bounds the [max_batch, rows] temporaries
};

// Bytes of each buffer the engine owns, for memory accounting.
struct EngineMemory {
  size_t kv_cache = 0;
  size_t activations = 0;
};

// Element counts of the engine's buffers for a shape and options: the one computation of the
// engine's memory. The constructor allocates exactly these; planners call plan_memory before any
// engine exists (a budget is split before weights load, a drafter's reserve before it is built).
struct BufferSizes {
  std::vector<int64_t> kv_capacity;  // per layer: cached positions (a sliding layer keeps a ring)
  std::vector<size_t> kv_bytes;      // per layer: bytes of its K and V together (kv_cache_bytes)
  int64_t x = 0, q = 0, kv = 0, ffn = 0, act2 = 0, out2 = 0, head_part = 0, mask = 0;  // floats / bytes
  int64_t max_cols = 0;              // widest activation row that is quantized
  size_t quantized_acts = 0;         // bytes of the Q8 activation buffers (QuantizedActs)
};
// Rows and columns a layer slot's tensor has in a model of this shape (a vector is {length, 1};
// -1: any positive size, a predictor's rank).
std::pair<int64_t, int64_t> slot_dims(const ModelShape& shape, Slot slot);

BufferSizes buffer_sizes(const ModelShape& shape, const std::vector<LayerShape>& layers, const EngineOptions& options);
EngineMemory plan_memory(const ModelShape& shape, const std::vector<LayerShape>& layers, const EngineOptions& options);

class Engine {
 public:
  Engine(const ModelShape& shape, std::vector<LayerShape> layers, const EngineOptions& options);

  void set_embedding(const WeightMatrix& table) { embed_ = table; }
  void set_head(const WeightMatrix& head) { head_ = head; }
  // Approximate head: `head` holds only the rows of these token ids; every other logit is -inf.
  void set_head_shortlist(const WeightMatrix& rows, std::vector<int32_t> ids);
  void set_output_norm(const float* w) { out_norm_ = w; }
  void set_layer_source(LayerSource* source) { source_ = source; }
  void set_head_source(HeadSource* source) { head_source_ = source; }        // null = the resident head
  void set_embedding_source(EmbeddingSource* source) { embed_source_ = source; }  // null = resident table
  void set_ffn_hook(FfnHook* hook) { ffn_hook_ = hook; }  // null = dense FFN everywhere
  // Per layer, the |act(gate . x)| below which an arena FFN skips a neuron (empty or 0: every neuron):
  // activation sparsity at a calibrated level, to measure what it costs.
  void set_ffn_thresholds(std::vector<float> thresholds);
  // The format of the down columns in a layer's FFN arena, when it is not the arena's (gate/up)
  // format: 4-bit arenas keep down at 5 bits (a block of a column spans 32 output dimensions,
  // and the residual stream's outlier dimensions cost a 4-bit column more than a 4-bit row).
  void set_arena_down_format(int64_t layer, Format fmt);
  // The precision of the down columns' product: the activation mode's where the level has an int8
  // product for `fmt` (then resident columns are laid out as column panels), else f32.
  ColumnActs column_acts(Format fmt) const;
  Format arena_down_format(int64_t layer, Format arena_fmt) const {  // of the arena's down columns
    return arena_down_[layer] < 0 ? arena_fmt : static_cast<Format>(arena_down_[layer]);
  }
  void set_partial_sums(PartialSums* sums) { partial_sums_ = sums; }  // null = one process holds everything

  // Run `n` new tokens (n <= max_batch). positions[j] is token j's position; tree_mask (n x n,
  // nonzero = token i may attend to new token j) is null for a plain sequence. New keys/values
  // go to scratch slots after the committed ones; without a tree they are committed at once,
  // with a tree only `commit` keeps the accepted path. Logits of the rows listed in
  // `logit_rows` are written to `logits` ([n_logit_rows, vocab]).
  // With `logits` null and `argmax` set, only each listed row's most likely token is returned
  // (greedy verification of a token tree without [rows, vocab] of logits in memory).
  // `extend_tree`: the new tokens grow the tree still uncommitted from the calls before (a draft
  // model drafting a tree level by level) instead of replacing it; tree_mask is then
  // n x (tree_size() + n), over the tree's earlier tokens and the new ones, and every token of the
  // tree, earlier or new, counts against max_batch.
  void forward(const int32_t* tokens, const int32_t* positions, int64_t n, const uint8_t* tree_mask,
               const int32_t* logit_rows, int64_t n_logit_rows, float* logits, int32_t* argmax = nullptr,
               bool extend_tree = false);

  // Keep the keys/values of the listed new tokens (tree node indices of the last forward, in
  // path order) as the next committed positions; drop the rest of the scratch slots.
  void commit(const int32_t* nodes, int64_t n_nodes);

  // The final-normed hidden state of each logit row of the last forward ([rows, d_model], what
  // the head multiplied): what a draft head trained on the model's own states learns from
  // (benchmarks/speculative/feature_head.py). `rows` must equal the last call's n_logit_rows.
  void hidden(float* out, int64_t rows) const;

  // Forget committed positions >= n. Returns how many committed positions are still usable:
  // sliding-window layers keep a ring buffer, so rolling back further than its slack loses
  // keys a later token would need, and then nothing is kept (the caller recomputes).
  int64_t truncate(int64_t n);

  int64_t committed() const { return committed_; }
  int64_t tree_size() const { return scratch_count_; }  // tree tokens forwarded and not yet committed
  const ModelShape& shape() const { return shape_; }
  const EngineOptions& options() const { return options_; }
  EngineMemory memory() const;

  // Per-operation wall time of forward passes (op_profile.h); off by default. Turning it on
  // clears what was collected.
  void set_profiling(bool on) {
    profile_ = OpProfile{};
    profiling_ = on;
  }
  const OpProfile& profile() const { return profile_; }

 private:
  struct LayerCache {
    std::vector<uint8_t> k, v;
    std::vector<int32_t> slot_pos;
    int64_t capacity = 0;
    int64_t sealed = 0;  // kivi2: positions below are in the 2-bit store
    bool wraps = true;   // a ring buffer (a sliding layer shorter than the context)
    KvCache view();
  };

  void run_block(int64_t layer, const LayerWeights& w, int64_t n, const int32_t* positions,
                 const int32_t* slots_of_layer, const uint8_t* attn_mask);
  void check_part(int64_t layer, const LayerWeights& w, LayerPart part) const;
  void part_ready(int64_t layer, LayerPart part);  // the source fills the part in (may wait for a read)
  void linear(const WeightMatrix& w, const float* x, QuantizedActs& xq, bool xq_ready, int64_t n, float* y);
  // Matrices reading the same input in one pass (q, k, v; gate, up): ys[i] = ws[i] x.
  void linear_multi(const WeightMatrix* ws, float* const* ys, int count, const float* x, QuantizedActs& xq,
                    bool xq_ready, int64_t n);
  // The gate, up and down parts of an arena as strided matrices (read in place).
  void arena_parts(int64_t layer, const WeightMatrix& a, WeightMatrix* gate_up, WeightMatrix* down) const;
  void ffn_from_arena(int64_t layer, const WeightMatrix& arena, const float* x, int64_t n, float* out);
  void build_attention_mask(int64_t layer, int64_t n, int64_t base, const uint8_t* tree_mask);
  void embed(const int32_t* tokens, int64_t n, float* x);
  void complete(PartialSums::Point point, int64_t layer, float* x, int64_t count);
  void compute_logits(int64_t m, float* logits);
  int64_t head_step() const;                              // head rows per chunk
  WeightMatrix head_rows(int64_t r0, int64_t rows) const;  // rows [r0, r0 + rows) of the resident head
  void compute_argmax(int64_t m, int32_t* out);

  ModelShape shape_;
  std::vector<LayerShape> layer_shapes_;
  EngineOptions options_;
  WeightMatrix embed_{}, head_{};
  std::vector<int32_t> head_ids_;  // non-empty: head_ holds just these vocabulary rows
  const float* out_norm_ = nullptr;
  LayerSource* source_ = nullptr;
  HeadSource* head_source_ = nullptr;
  EmbeddingSource* embed_source_ = nullptr;
  FfnHook* ffn_hook_ = nullptr;
  PartialSums* partial_sums_ = nullptr;

  std::vector<LayerCache> caches_;
  int64_t committed_ = 0;       // positions 0..committed_-1 are in the cache
  int64_t scratch_base_ = 0;    // first scratch slot index (mod capacity) of the last tree forward
  int64_t scratch_count_ = 0;   // tree tokens written by the last forward and not yet committed
  std::vector<int32_t> scratch_positions_;
  int64_t hidden_rows_ = 0;     // rows of sel_ holding the last forward's normed hidden states

  // Work buffers sized for max_batch tokens.
  std::vector<float> x_, h_, q_, k_, v_, attn_, gate_, up_, sel_;
  std::vector<float> act2_, out2_;  // q8x2: [activations; residuals] and the doubled GEMM output
  int64_t out2_capacity_ = 0;       // floats out2_ was sized for (it never grows)
  std::vector<float> head_part_;    // logits of one head chunk for several rows
  std::vector<int32_t> slots_;
  std::vector<int32_t> all_neurons_;  // 0..d_ff-1: an arena FFN runs over every neuron
  std::vector<float> ffn_thresholds_, token_thresholds_;  // per layer; per token of a call
  std::vector<int> arena_down_;  // per layer: Format of the arena's down part, -1 = the arena's format
  std::vector<uint8_t> mask_;
  QuantizedActs xq_;

  OpProfile profile_;
  bool profiling_ = false;
  OpProfile* prof() { return profiling_ ? &profile_ : nullptr; }
};

}  // namespace ef::engine
