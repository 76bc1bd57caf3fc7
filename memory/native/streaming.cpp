#include "streaming.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "edgeflash/thread_pool.h"

namespace ef::memory {

size_t StreamUnit::bytes() const {
  size_t n = 0;
  for (const auto& r : ranges) n += r.second;
  return n;
}

StreamingWeights::StreamingWeights(std::shared_ptr<DirectReader> reader, ResidentLayers* resident,
                                   int64_t n_layers, std::vector<StreamUnit> units, int slots, size_t staging_bytes,
                                   bool prefetch, const StreamingWeights* lender)
    : reader_(std::move(reader)), resident_(resident), units_(std::move(units)),
      part_unit_(n_layers * kLayerParts, -1), prefetch_(prefetch) {
  if (slots < 1) throw std::invalid_argument("streaming: at least one staging slot is needed");
  size_t largest = 0;
  int64_t last_layer = -1, last_part = kLayerParts - 1;
  bool seen_head = false;
  for (int64_t u = 0; u < static_cast<int64_t>(units_.size()); ++u) {
    const StreamUnit& unit = units_[u];
    largest = std::max(largest, unit.bytes());
    for (const auto& r : unit.ranges)
      if (r.first < 0 || r.first % kIoAlignment || r.second % kIoAlignment)
        throw std::invalid_argument("streaming: unit ranges must be 4096-aligned");
    for (const StreamedTensor& t : unit.tensors) {
      if (t.rows < 1 || t.cols < 1) throw std::invalid_argument("streaming: a streamed tensor has no rows or columns");
      if (!is_matrix(t.target) && unit.layer >= 0 && t.fmt != Format::f32)
        throw std::invalid_argument(std::string("streaming: vector '") + slot_info(t.target).name + "' must be f32");
      if (t.stride && t.stride < row_bytes(t.fmt, t.cols))
        throw std::invalid_argument(std::string("streaming: tensor '") + slot_info(t.target).name +
                                    "' has a row stride shorter than its rows");
      if (t.offset % 4 || t.offset + t.bytes() > unit.bytes())
        throw std::invalid_argument(std::string("streaming: tensor '") + slot_info(t.target).name +
                                    "' lies outside its unit's bytes");
      const LayerPart part = slot_info(t.target).part;
      if (unit.layer >= 0 && (part < unit.first_part || part > unit.last_part))
        throw std::invalid_argument(std::string("streaming: tensor '") + slot_info(t.target).name +
                                    "' belongs to a part of the layer its unit does not cover");
    }
    if (unit.layer >= 0) {
      const int first = static_cast<int>(unit.first_part), last = static_cast<int>(unit.last_part);
      const bool follows = unit.layer > last_layer || (unit.layer == last_layer && first > last_part);
      if (seen_head || !follows || unit.layer >= n_layers || first > last || first < 0 || last >= kLayerParts)
        throw std::invalid_argument(
            "streaming: layer units must come first, in increasing order of layer and part, each part once");
      for (int p = first; p <= last; ++p) part_unit_[unit.layer * kLayerParts + p] = u;
      last_layer = unit.layer;
      last_part = last;
    } else {
      if (unit.head_chunk != static_cast<int64_t>(head_units_.size()) || unit.tensors.size() != 1)
        throw std::invalid_argument("streaming: head chunks must come last, in order, one matrix each");
      head_units_.push_back(u);
      seen_head = true;
    }
  }
  // One arena holds every slot, so that slots smaller than a huge page still sit in huge pages.
  const size_t slot = align_up(largest);
  const size_t need = slot * static_cast<size_t>(slots);
  if (lender) {
    arena_ = lender->arena_;
    borrowed_ = true;
    arena_->shared = true;
    place_retained(slot, staging_bytes ? std::min(staging_bytes, arena_->buffer.size()) : arena_->buffer.size());
  } else {
    if (staging_bytes && staging_bytes < need)
      throw std::invalid_argument("streaming: the staging arena must hold " + std::to_string(slots) + " units of " +
                                  std::to_string(slot) + " bytes");
    arena_ = std::make_shared<StagingArena>(std::max(need, staging_bytes));
    for (int i = 0; i < slots; ++i) slots_.push_back(arena_->buffer.data() + static_cast<size_t>(i) * slot);
  }
  slot_busy_.assign(slots_.size(), false);
  retained_reads_.resize(retained_);
  retained_valid_.assign(retained_, false);
}

void StreamingWeights::place_retained(size_t slot, size_t size) {
  // Layer units only (a head chunk is read once a pass anyway), packed from the arena's start at
  // their own sizes; unless every one fits (and no head streams), two slots of the largest unit
  // stay at the end of the `size` bytes used for the units that stream through.
  uint8_t* base = arena_->buffer.data();
  const int64_t layer_units = static_cast<int64_t>(units_.size() - head_units_.size());
  size_t all = 0;
  for (int64_t u = 0; u < layer_units; ++u) all += align_up(units_[u].bytes());
  const bool ring = !(head_units_.empty() && all <= size);
  if (ring && 2 * slot > size)
    throw std::invalid_argument("streaming: a borrowed staging arena of " + std::to_string(size) +
                                " bytes cannot hold two units of " + std::to_string(slot) + " bytes");
  const size_t room = ring ? size - 2 * slot : size;
  size_t used = 0;
  for (int64_t u = 0; u < layer_units && used + align_up(units_[u].bytes()) <= room; ++u) {
    retained_at_.push_back(base + used);
    used += align_up(units_[u].bytes());
  }
  retained_ = static_cast<int64_t>(retained_at_.size());
  if (ring)
    for (int i = 0; i < 2; ++i) slots_.push_back(base + room + static_cast<size_t>(i) * slot);
}

StreamingWeights::~StreamingWeights() {
  surrender();
  if (arena_->holder == this) arena_->holder = nullptr;
}

size_t StreamingWeights::staging_bytes() const { return borrowed_ ? 0 : arena_->buffer.size(); }

int64_t StreamingWeights::first_layer_unit() const {
  return static_cast<int64_t>(units_.size() - head_units_.size()) > retained_ ? retained_ : -1;
}

int64_t StreamingWeights::next_unit(int64_t unit) const {
  const int64_t n = static_cast<int64_t>(units_.size());
  const int64_t n_layer_units = n - static_cast<int64_t>(head_units_.size());
  // the first unit a pass reads through the ring: its first layer unit not retained, else head chunk 0
  const int64_t first = n_layer_units > retained_ ? retained_ : n_layer_units;
  if (unit + 1 == n_layer_units && units_[unit].layer >= 0)
    return needs_head_ && !head_units_.empty() ? unit + 1 : first;  // after the last layer
  return unit + 1 >= n ? first : unit + 1;
}

void StreamingWeights::claim_arena() {
  if (arena_->holder == this) return;
  if (arena_->holder) arena_->holder->surrender();
  arena_->holder = this;
}

void StreamingWeights::surrender() {
  drain();
  for (int64_t u = 0; u < retained_; ++u) {
    for (const uint64_t ticket : retained_reads_[u]) {
      try {
        reader_->wait(ticket);
      } catch (const std::exception&) {
        // as in drain(): the next read of the unit reports the error
      }
    }
    retained_reads_[u].clear();
    retained_valid_[u] = false;
  }
  ahead_ = false;
  issued_ahead_ = 0;
}

void StreamingWeights::issue_retained(int64_t unit) {
  uint8_t* dst = retained_at_[unit];
  for (const auto& [offset, bytes] : units_[unit].ranges) {
    retained_reads_[unit].push_back(reader_->submit(offset, bytes, dst));
    dst += bytes;
  }
  ++stats_.units_read;
}

void StreamingWeights::issue_one() {
  int slot = -1;
  for (int i = 0; i < static_cast<int>(slots_.size()); ++i)
    if (!slot_busy_[i]) {
      slot = i;
      break;
    }
  if (slot < 0) throw std::logic_error("streaming: no free staging slot");
  const int64_t u = pending_next_;
  uint8_t* dst = slots_[slot];
  InFlight f{u, slot, {}};
  for (const auto& [offset, bytes] : units_[u].ranges) {  // ranges land back to back in the slot
    f.tickets.push_back(reader_->submit(offset, bytes, dst));
    dst += bytes;
  }
  slot_busy_[slot] = true;
  in_flight_.push_back(std::move(f));
  ++stats_.units_read;
  if (ahead_) ++issued_ahead_;  // this unit belongs to the next pass
  const int64_t next = next_unit(u);
  if (next <= u) ahead_ = true;  // the following unit wraps into the next pass
  pending_next_ = next;
}

void StreamingWeights::fill() {
  if (slots_.empty()) return;  // every unit is retained: nothing streams through the ring
  const size_t limit = prefetch_ ? slots_.size() : 1;
  while (!units_.empty() && in_flight_.size() < limit) {
    if (ahead_) {
      if (arena_->shared) return;  // the next pass may be the other engine's
      // Run ahead only through the next pass's layers: whether it needs the head is known at its
      // begin_pass, and wrapping a second time would be two passes ahead.
      if (units_[pending_next_].layer < 0) return;
      if (issued_ahead_ > 0 && pending_next_ == first_layer_unit()) return;
    }
    issue_one();
  }
}

void StreamingWeights::drain() {
  for (const InFlight& f : in_flight_) {
    for (const uint64_t ticket : f.tickets) {
      try {
        reader_->wait(ticket);
      } catch (const std::exception&) {
        // a failed read of a unit nobody will use: the next read of it reports the error
      }
    }
    slot_busy_[f.slot] = false;
  }
  in_flight_.clear();
}

void StreamingWeights::begin_pass(bool needs_head) {
  reader_->check_unchanged();
  ++stats_.passes;
  needs_head_ = needs_head;
  if (units_.empty()) return;
  claim_arena();
  for (int64_t u = 0; u < retained_; ++u)  // retained units read first: they come first in a pass
    if (!retained_valid_[u] && retained_reads_[u].empty()) issue_retained(u);
  const int64_t n_layer_units = static_cast<int64_t>(units_.size() - head_units_.size());
  const int64_t first = n_layer_units > retained_ ? retained_ : (needs_head && !head_units_.empty() ? n_layer_units : -1);
  if (first < 0) {  // nothing streams through the ring in this pass
    drain();
    return;
  }
  // Units read ahead for this pass must start at its first unit; anything else is left over
  // from a pass that stopped early.
  if (!in_flight_.empty() && (!ahead_ || in_flight_.front().unit != first)) drain();
  if (in_flight_.empty()) pending_next_ = first;
  ahead_ = false;
  issued_ahead_ = 0;
  if (prefetch_) fill();
}

const StreamingWeights::InFlight& StreamingWeights::wait_front(int64_t unit) {
  if (in_flight_.empty()) {
    pending_next_ = unit;
    issue_one();
  } else {
    ++stats_.prefetched_hits;
  }
  const InFlight& f = in_flight_.front();
  if (f.unit != unit)
    throw std::logic_error("streaming: the engine asked for unit " + std::to_string(unit) + " but " +
                           std::to_string(f.unit) + " is next in the read order");
  // If compute has to wait for this read, the pool's idle workers would spin for the next kernel
  // and hold a core the I/O threads need (a small board has two to four): park them.
  for (const uint64_t ticket : f.tickets) reader_->wait(ticket, [] { ThreadPool::global().park(); });
  return f;
}

const uint8_t* StreamingWeights::wait_retained(int64_t unit) {
  if (retained_valid_[unit]) {
    ++stats_.retained_hits;
    return retained_at_[unit];
  }
  if (retained_reads_[unit].empty()) issue_retained(unit);
  const std::vector<uint64_t> tickets = std::move(retained_reads_[unit]);
  retained_reads_[unit].clear();  // a failed read is issued again by the next pass
  for (const uint64_t ticket : tickets) reader_->wait(ticket, [] { ThreadPool::global().park(); });
  retained_valid_[unit] = true;
  return retained_at_[unit];
}

void StreamingWeights::pop_front() {
  slot_busy_[in_flight_.front().slot] = false;
  in_flight_.pop_front();
  if (prefetch_) fill();
}

const LayerWeights& StreamingWeights::acquire(int64_t layer) {
  bool streamed = false;
  for (int p = 0; p < kLayerParts; ++p) streamed |= unit_of(layer, static_cast<LayerPart>(p)) >= 0;
  if (!streamed) return resident_->acquire(layer);
  current_ = resident_->at(layer);
  filled_through_ = -1;
  parts_done_ = 0;
  ready(layer, LayerPart::attention);
  return current_;
}

void StreamingWeights::ready(int64_t layer, LayerPart part) {
  const int64_t u = unit_of(layer, part);
  if (u < 0 || u <= filled_through_) return;  // resident, or filled in with an earlier part
  const uint8_t* base = retained(u) ? wait_retained(u) : slots_[wait_front(u).slot];
  for (const StreamedTensor& t : units_[u].tensors) {
    const uint8_t* p = base + t.offset;
    if (is_matrix(t.target))
      current_.matrix(t.target) = WeightMatrix{p, t.bytes(), t.fmt, t.rows, t.cols, t.stride};
    else
      current_.vector(t.target) = reinterpret_cast<const float*>(p);
  }
  filled_through_ = u;
}

void StreamingWeights::done(int64_t layer, LayerPart part) {
  // Parts end in order; a unit's slot is free once its last part has ended. A unit the engine
  // never asked for (a part its FFN path does not read) is still waited for: a read must not land
  // in a slot that was given to the next one.
  for (; parts_done_ <= static_cast<int>(part); ++parts_done_) {
    const LayerPart p = static_cast<LayerPart>(parts_done_);
    const int64_t u = unit_of(layer, p);
    if (u < 0 || units_[u].last_part != p) continue;
    ready(layer, p);
    if (!retained(u)) pop_front();
  }
}

void StreamingWeights::release(int64_t layer) { done(layer, LayerPart::ffn_out); }

const WeightMatrix& StreamingWeights::acquire_chunk(int64_t chunk, int64_t* first_row) {
  const int64_t u = head_units_.at(chunk);
  const InFlight& f = wait_front(u);
  const StreamedTensor& t = units_[u].tensors[0];
  head_chunk_ = WeightMatrix{slots_[f.slot] + t.offset, t.bytes(), t.fmt, t.rows, t.cols, 0};
  *first_row = units_[u].head_row0;
  return head_chunk_;
}

void StreamingWeights::release_chunk(int64_t chunk) { pop_front(); }

StreamedEmbedding::StreamedEmbedding(std::shared_ptr<DirectReader> reader, int64_t table_offset, Format fmt,
                                     int64_t rows, int64_t cols)
    : reader_(std::move(reader)), table_offset_(table_offset), fmt_(fmt), rows_(rows), cols_(cols),
      row_bytes_(row_bytes(fmt, cols)), page_(align_up(row_bytes(fmt, cols)) + kIoAlignment) {}

void StreamedEmbedding::rows(const int32_t* tokens, int64_t n, float* out) {
  for (int64_t t = 0; t < n; ++t) {
    if (tokens[t] < 0 || tokens[t] >= rows_) throw KernelError("embedding: token id out of range");
    const int64_t at = table_offset_ + static_cast<int64_t>(tokens[t]) * static_cast<int64_t>(row_bytes_);
    const int64_t start = align_down(at);
    const size_t span = align_up(static_cast<size_t>(at - start) + row_bytes_);
    reader_->read_now(start, span, page_.data());
    const WeightMatrix row{page_.data() + (at - start), row_bytes_, fmt_, 1, cols_, 0};
    dequantize_rows(row, nullptr, 1, out + t * cols_);
  }
}

}  // namespace ef::memory
