// Approximate feed-forward from flash: per layer a low-rank predictor guesses which FFN neurons a
// token activates; those neurons' bundles (gate row, up row, down column: contiguous in the
// bundle's arena) are kept in a windowed cache - the union of neurons used by the last k tokens
// stays, new ones are appended, stale ones leave by swap-with-last - and the sparse kernel
// computes only them, skipping any whose activation falls under the calibrated threshold.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "direct_reader.h"
#include "layer_source.h"

namespace ef::memory {

struct SparseLayerSpec {
  int64_t arena_offset = 0;  // absolute file offset of arena slot 0
  size_t stride = 0;         // bytes per neuron bundle in the file
  std::vector<int32_t> file_slot_of_neuron;  // neuron id -> arena slot in the file (a permutation)
  int64_t n_neurons() const { return static_cast<int64_t>(file_slot_of_neuron.size()); }
  float pred_threshold = 0.0f;  // neuron predicted active when |act(B A x)| > this
  float act_threshold = 0.0f;  // the kernel skips a neuron when |act(gate . x)| < this (0: never)
  bool has_down = false;         // the layer's down columns in `down` rather than the cache's default
  Format down = Format::q8_0;    // (an exporter may give layers different down formats)
};

struct NeuronCacheStats {
  uint64_t lookups = 0, hits = 0, loaded = 0, evicted = 0, bytes_read = 0, predicted = 0, tokens = 0, passes = 0;
  uint64_t reads = 0;
  // read_pages[p] = reads of p 4 KiB pages (the last entry counts every longer read): a read's size
  // decides how fast the storage serves it, and the mean hides the many small ones
  std::vector<uint64_t> read_pages = std::vector<uint64_t>(257, 0);
};

class NeuronCacheFfn : public FfnHook {
 public:
  NeuronCacheFfn(std::shared_ptr<DirectReader> reader, std::vector<SparseLayerSpec> layers, int64_t d_model,
                 Format gate, Format up, Format down, Activation act, int64_t capacity, int64_t window);

  bool active(int64_t layer) const override { return layer >= 0 && layer < static_cast<int64_t>(layers_.size()); }
  void compute(int64_t layer, const LayerWeights& w, const float* x, int64_t n, float* out) override;

  // Chunk-aware selection: the arena is cut into chunks of `chunk` neurons in file order (the most
  // often active first), each token reads whole chunks - the `keep` share of
  // all chunks with the largest predicted activation mass (a fixed top-k: a predictable read
  // budget, and reads of chunk x stride bytes that merge with selected neighbours) - and the
  // first `resident` neurons of every layer (the hottest) are read once now and never evicted.
  // chunk 0: neuron by neuron, each predicted active one (the predictor's threshold).
  void set_chunks(int64_t chunk, float keep, int64_t resident);

  NeuronCacheStats stats() const { return stats_; }
  size_t cache_bytes() const;

 private:
  struct Cache {
    Format down;                      // the layer's down format
    size_t bundle;                    // bytes of one of the layer's bundles in the cache (no file padding)
    AlignedBuffer arena;              // capacity x bundle bytes
    std::vector<int32_t> neuron_of;   // cache slot -> neuron
    std::vector<int32_t> slot_of;     // neuron -> cache slot or -1
    std::vector<uint64_t> last_used;  // cache slot -> token step it was last needed
    int64_t used = 0;
    int64_t pinned = 0;               // slots [0, pinned) hold resident neurons, never evicted
  };

  void predict(const SparseLayerSpec& spec, const LayerWeights& w, const float* x, int64_t n,
               std::vector<int32_t>* active);
  void select_chunks(const SparseLayerSpec& spec, int64_t n, std::vector<int32_t>* active);
  void evict_stale(Cache& c);
  void evict_slot(Cache& c, int64_t slot);
  // Reads go in batches that fit one of two bounce buffers: a batch is a list of page runs, each
  // covering neurons [first, last) of the file-sorted order.
  struct Run { int64_t start, end; size_t first, last; };
  struct Batch { std::vector<Run> runs; std::vector<uint64_t> tickets; };
  void plan_batches(const SparseLayerSpec& spec, const Cache& c, const std::vector<int32_t>& neurons);
  void submit(Batch& b, uint8_t* buffer);
  // Waits for the batch, copies its bundles into free cache slots, appends the slots to `slots`.
  void finish(const SparseLayerSpec& spec, Cache& c, Batch& b, const uint8_t* buffer, std::vector<int32_t>* slots);
  void load(const SparseLayerSpec& spec, Cache& c, const std::vector<int32_t>& neurons);
  void run_kernel(const Cache& c, const SparseLayerSpec& s, const float* x, int64_t n, const std::vector<int32_t>& slots,
                  float* out, bool* accumulate);

  std::shared_ptr<DirectReader> reader_;
  std::vector<SparseLayerSpec> layers_;
  std::vector<Cache> caches_;
  int64_t d_model_;
  Format gate_, up_, down_;
  Activation act_;
  int64_t capacity_, window_;
  int64_t chunk_ = 0, resident_ = 0;
  float keep_ = 1.0f;
  std::vector<std::vector<int32_t>> neuron_of_file_slot_;  // per layer: arena slot -> neuron
  std::vector<float> score_;
  std::vector<int64_t> ranked_;
  uint64_t step_ = 0;  // one step per forward pass (counted at layer 0)
  std::vector<float> t_, p_, partial_, thresholds_;
  std::vector<int32_t> active_, missing_, slots_;
  std::vector<int64_t> victims_;
  std::vector<uint32_t> mark_;  // neuron -> stamp of the round that needs it
  uint32_t stamp_ = 0;
  AlignedBuffer bounce_;  // two halves: one batch is read while the previous one computes
  std::vector<std::pair<int64_t, int32_t>> order_;  // (file slot, neuron) of the neurons to read
  std::vector<Batch> batches_;
  std::vector<int32_t> loaded_slots_;
  NeuronCacheStats stats_;
};

}  // namespace ef::memory
