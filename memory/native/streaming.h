// Weights that live in flash and are read for every forward pass: the layers (and the output
// head, in row chunks) the memory plan did not keep resident. Reads go through DirectReader into
// a ring of staging slots; with prefetch on, the next units load while the current one computes
// (across the pass boundary too: the next token's first layers load while the head runs).
//
// A draft model and its target compute in turn, never at once, so a budgeted draft model streams
// through its target's staging arena instead of one of its own (StagingArena). The target's slots
// are sized for its largest unit, several of the draft model's, so the draft model keeps its first
// streamed units in the arena, packed at their own sizes, for as long as it holds it: of the
// several draft tokens of a step, only the first reads them.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "direct_reader.h"
#include "layer_source.h"

namespace ef::memory {

// Where a streamed tensor lands inside its unit's staging slot, and what it is. (The embedding
// table read on demand is described the same way, `offset` then being its offset in the file.)
struct StreamedTensor {
  Slot target = Slot::q;  // the layer slot it fills (a head chunk's matrix: unused)
  size_t offset = 0;
  Format fmt = Format::f32;
  int64_t rows = 0, cols = 0;  // a vector is {length, 1}
  size_t stride = 0;           // bytes from one row to the next; 0 = packed rows (a neuron arena: its bundle)
  size_t bytes() const { return static_cast<size_t>(rows) * (stride ? stride : row_bytes(fmt, cols)); }
};

// One read unit: a layer's streamed tensors of one or more consecutive parts (a whole layer by
// default), or one chunk of head rows.
struct StreamUnit {
  int64_t layer = -1;       // >= 0: a layer unit
  LayerPart first_part = LayerPart::attention, last_part = LayerPart::ffn_out;
  int64_t head_chunk = -1;  // >= 0: a head chunk
  int64_t head_row0 = 0;
  std::vector<std::pair<int64_t, size_t>> ranges;  // (file offset, bytes), 4 KiB aligned, read back to back
  std::vector<StreamedTensor> tensors;
  size_t bytes() const;
};

// Everything a budgeted engine streams, as the planner decided it: the file, how it is read, the
// units (layers and their parts in order, then head chunks) and, when the table is not resident,
// where the embedding's rows are (`embedding.offset` is then an offset in the file).
struct StreamingPlan {
  std::string path;
  bool direct = true;
  int io_threads = 1;
  size_t chunk_bytes = 1 << 20;
  std::vector<StreamUnit> units;
  int slots = 2;
  bool prefetch = true;
  size_t staging_bytes = 0;  // the staging slots' arena (0: just the slots)
  bool stream_embedding = false;
  StreamedTensor embedding;
};

// The one buffer of staging slots, and which StreamingWeights has it now. A pass claims it; the
// previous holder's reads into it are waited for and forgotten (StreamingWeights::surrender).
// Not thread-safe: its users run their passes one after the other.
class StreamingWeights;
struct StagingArena {
  explicit StagingArena(size_t bytes) : buffer(bytes) {}
  AlignedBuffer buffer;
  StreamingWeights* holder = nullptr;
  bool shared = false;  // a borrower takes turns with its lender: no pass reads ahead into the next
};

struct StreamStats {
  uint64_t passes = 0;
  uint64_t units_read = 0;
  uint64_t prefetched_hits = 0;  // units already complete or in flight when the engine asked
  uint64_t retained_hits = 0;    // units still in their slot from an earlier pass of this turn
};

class StreamingWeights : public LayerSource, public HeadSource {
 public:
  // `resident` has every resident tensor of every layer set; streamed ones are filled per pass.
  // `slots` staging slots of the largest unit, in one arena of `staging_bytes` (0: just the slots;
  // the plan may round it up to whole huge pages); prefetch keeps up to `slots` units in flight.
  // `lender`: stream through the first `staging_bytes` (0: all) of that one's arena instead of an
  // arena of its own (`slots` then does not apply): the first units that fit are retained, packed
  // at their own sizes, leaving two slots of the largest unit for the rest.
  StreamingWeights(std::shared_ptr<DirectReader> reader, ResidentLayers* resident, int64_t n_layers,
                   std::vector<StreamUnit> units, int slots, size_t staging_bytes, bool prefetch,
                   const StreamingWeights* lender = nullptr);
  ~StreamingWeights() override;  // no read may land in a freed staging slot

  // LayerSource
  void begin_pass(bool needs_head) override;
  const LayerWeights& acquire(int64_t layer) override;
  void ready(int64_t layer, LayerPart part) override;
  void done(int64_t layer, LayerPart part) override;  // frees the slot of a unit whose last part is done
  void release(int64_t layer) override;               // done with every part left
  // HeadSource (only used when the head is streamed)
  int64_t n_chunks() override { return static_cast<int64_t>(head_units_.size()); }
  const WeightMatrix& acquire_chunk(int64_t chunk, int64_t* first_row) override;
  void release_chunk(int64_t chunk) override;

  bool streams_head() const { return !head_units_.empty(); }
  size_t staging_bytes() const;  // of its own arena (0 for a borrower)
  int64_t retained_units() const { return retained_; }
  StreamStats stats() const { return stats_; }
  // Another engine's pass takes the arena: wait for this one's reads into it, forget what it holds.
  void surrender();

 private:
  struct InFlight {
    int64_t unit;
    int slot;
    std::vector<uint64_t> tickets;  // one per range
  };

  int64_t unit_of(int64_t layer, LayerPart part) const {
    return part_unit_.at(layer * kLayerParts + static_cast<int>(part));
  }
  int64_t next_unit(int64_t unit) const;  // execution order, across the pass boundary
  int64_t first_layer_unit() const;
  void claim_arena();
  void place_retained(size_t slot, size_t size);  // a borrower's retained units and ring in its part of the arena
  bool retained(int64_t unit) const { return unit < retained_; }
  void issue_one();
  void issue_retained(int64_t unit);
  const uint8_t* wait_retained(int64_t unit);  // its slot, once its bytes are in
  void fill();
  const InFlight& wait_front(int64_t unit);
  void pop_front();
  void drain();

  std::shared_ptr<DirectReader> reader_;
  ResidentLayers* resident_;
  std::vector<StreamUnit> units_;
  std::vector<int64_t> part_unit_;   // layer * kLayerParts + part -> unit index or -1 (resident)
  std::vector<int64_t> head_units_;  // head chunk -> unit index
  std::shared_ptr<StagingArena> arena_;
  bool borrowed_ = false;
  std::vector<uint8_t*> slots_;  // into arena_: the ring the streamed units pass through
  std::vector<uint8_t*> retained_at_;  // into arena_: where retained unit u always lands
  int64_t retained_ = 0;         // units 0..retained_-1 keep their place while this one holds the arena
  std::vector<std::vector<uint64_t>> retained_reads_;  // a retained unit's tickets while it is read
  std::vector<bool> retained_valid_;                   // its bytes are in place
  std::vector<bool> slot_busy_;
  bool prefetch_;
  bool needs_head_ = true;
  int64_t pending_next_ = 0;  // the next unit to issue
  bool ahead_ = false;        // the issue cursor has wrapped into the next pass
  int64_t issued_ahead_ = 0;  // units issued for the next pass
  std::deque<InFlight> in_flight_;
  LayerWeights current_;       // the acquired layer: resident tensors, and those of the parts filled in
  int64_t filled_through_ = -1;  // the last unit of the acquired layer whose tensors are in current_
  int parts_done_ = 0;           // the acquired layer's parts the engine is done with
  WeightMatrix head_chunk_{};
  StreamStats stats_;
};

// Embedding rows read on demand: each token's row comes from the 4 KiB pages holding it.
class StreamedEmbedding : public EmbeddingSource {
 public:
  StreamedEmbedding(std::shared_ptr<DirectReader> reader, int64_t table_offset, Format fmt, int64_t rows,
                    int64_t cols);
  void rows(const int32_t* tokens, int64_t n, float* out) override;

 private:
  std::shared_ptr<DirectReader> reader_;
  int64_t table_offset_;
  Format fmt_;
  int64_t rows_, cols_;
  size_t row_bytes_;
  AlignedBuffer page_;
};

}  // namespace ef::memory
