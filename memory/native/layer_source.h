// What the engine reads its weights through, declared below it (runtime/native/engine.h includes
// this; memory/native implements it by streaming from flash): the tensors of one layer by slot,
// and the sources of layers, head rows and embedding rows, and the FFN replacement hook.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "edgeflash/kernels.h"

namespace ef {

// The tensors a layer may have. The one table of their names is in layer_source.cpp: the engine's
// name of each slot and the per-layer tensor it holds (GGUF/bundle naming, after "blk.N.").
enum class Slot : int {
  q, k, v, o, gate, up, down, pred_a, pred_b,                   // matrices (predictors: sparse mode only)
  ffn_arena,  // the FFN as neuron bundles [d_ff, stride]: gate row, up row, down column (one format)
  attn_norm, ffn_norm, post_attn_norm, post_ffn_norm, q_norm, k_norm, q_bias, k_bias, v_bias,  // f32 vectors
  count
};
constexpr int kSlotCount = static_cast<int>(Slot::count);
constexpr int kMatrixSlots = static_cast<int>(Slot::attn_norm);

// The parts of a block, in the order the engine reads them: attention (with its norms and
// biases), the FFN's input side (its norm and gate, or the arena, or the predictors), its up
// matrix, and its output side (down and the norm after it). A streaming source may read a layer
// part by part, so that a staging slot holds the largest part instead of a whole layer.
enum class LayerPart : int { attention, ffn_in, ffn_up, ffn_out, count };
constexpr int kLayerParts = static_cast<int>(LayerPart::count);

struct SlotInfo {
  const char* name;    // the engine's name ("gate")
  const char* tensor;  // the layer tensor it holds ("ffn_gate.weight")
  LayerPart part;      // the part of the block that reads it
};

const SlotInfo& slot_info(Slot s);
bool parse_slot(const std::string& name, Slot* out);  // false for an unknown name
inline bool is_matrix(Slot s) { return static_cast<int>(s) < kMatrixSlots; }

// Everything one block reads. Vectors (norms, biases) are f32; null when the model has none.
struct LayerWeights {
  WeightMatrix q, k, v, o, gate, up, down;
  WeightMatrix pred_a, pred_b;  // sparse mode's neuron predictor: [rank, d_model], [d_ff, rank]
  // A bundle's one copy of the FFN: rows = neurons, cols = d_model, stride = one neuron bundle;
  // when set, gate/up/down are unused (the engine runs the FFN over every neuron of the arena).
  WeightMatrix ffn_arena;
  // The same arena laid out at load for the kernels (resident weights): gate and up hold its gate
  // and up rows in panels, down_columns its down columns (rows = neurons, cols = d_model, one
  // neuron's down column per row, the arena's down format). When set, the FFN runs as gate and up
  // in one pass and a column product; ffn_arena stays set for runs with activation thresholds.
  WeightMatrix down_columns;
  const float* attn_norm = nullptr;
  const float* ffn_norm = nullptr;
  const float* post_attn_norm = nullptr;
  const float* post_ffn_norm = nullptr;
  const float* q_norm = nullptr;
  const float* k_norm = nullptr;
  const float* q_bias = nullptr;
  const float* k_bias = nullptr;
  const float* v_bias = nullptr;

  // The field of a slot (KernelError for a vector slot / a matrix slot respectively).
  WeightMatrix& matrix(Slot s);
  const float*& vector(Slot s);
};

// Where a layer's weights come from. `acquire` may block until they are in memory (streamed
// from flash); `release` says the forward pass is done with them for this call. Between the two
// the engine walks the layer's parts in order: `ready(part)` before it reads a part's tensors (a
// source that reads parts separately fills them into the weights `acquire` returned), `done(part)`
// once it no longer reads them. Only the attention part is sure to be filled by `acquire` alone.
class LayerSource {
 public:
  virtual ~LayerSource() = default;
  virtual const LayerWeights& acquire(int64_t layer) = 0;
  virtual void ready(int64_t layer, LayerPart part) {}
  virtual void done(int64_t layer, LayerPart part) {}
  virtual void release(int64_t layer) {}
  // A forward pass starts; `needs_head` says whether it will compute logits (a streaming source
  // uses it to plan what to read next).
  virtual void begin_pass(bool needs_head) {}
};

// All layers resident: acquire is a lookup.
class ResidentLayers : public LayerSource {
 public:
  explicit ResidentLayers(int64_t n_layers) : layers_(n_layers) {}
  LayerWeights& at(int64_t layer) { return layers_.at(layer); }
  const LayerWeights& acquire(int64_t layer) override { return layers_.at(layer); }

 private:
  std::vector<LayerWeights> layers_;
};

// Where the output head's rows come from when it is not one resident matrix: chunks of rows
// (for example streamed from flash, the next chunk loading while this one computes).
class HeadSource {
 public:
  virtual ~HeadSource() = default;
  virtual int64_t n_chunks() = 0;
  // Rows [first_row, first_row + chunk.rows) of the head.
  virtual const WeightMatrix& acquire_chunk(int64_t chunk, int64_t* first_row) = 0;
  virtual void release_chunk(int64_t chunk) {}
};

// A replacement for a layer's dense feed-forward (approximate mode: only predicted-active neurons,
// from a windowed neuron cache). `active(layer)` says whether it handles that layer.
class FfnHook {
 public:
  virtual ~FfnHook() = default;
  virtual bool active(int64_t layer) const = 0;
  // x: [n, d_model] the normed FFN input; out: [n, d_model] the FFN output (before post-norm).
  virtual void compute(int64_t layer, const LayerWeights& w, const float* x, int64_t n, float* out) = 0;
};

// Tensor parallelism: a rank holds a share of every layer's attention heads and FFN neurons, so the
// attention output projection and the FFN down projection each give it a partial sum of the
// residual update, and `complete` sums those across ranks in place (an all-reduce). With the
// vocabulary split by rows, the embedding rows are partial too (a rank has zeros for the tokens it
// does not hold). Every rank calls it at the same points in the same order.
class PartialSums {
 public:
  enum class Point : int { embedding = 0, attention = 1, ffn = 2 };
  virtual ~PartialSums() = default;
  // x: [count] floats, replaced by their sum over ranks; layer is -1 for the embedding.
  virtual void complete(Point point, int64_t layer, float* x, int64_t count) = 0;
};

// Where embedding rows come from when the table is not resident (read on demand).
class EmbeddingSource {
 public:
  virtual ~EmbeddingSource() = default;
  virtual void rows(const int32_t* tokens, int64_t n, float* out) = 0;  // out: [n, d_model] f32
};

}  // namespace ef
