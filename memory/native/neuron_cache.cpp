#include "neuron_cache.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <stdexcept>

namespace ef::memory {
namespace {

constexpr size_t kBounceBytes = 1 << 20;  // one batch of neuron reads

float activation(float v, Activation act) {
  if (act == Activation::silu) return v / (1.0f + std::exp(-v));
  const float c = 0.7978845608f;  // sqrt(2 / pi)
  return 0.5f * v * (1.0f + std::tanh(c * (v + 0.044715f * v * v * v)));
}

}  // namespace

NeuronCacheFfn::NeuronCacheFfn(std::shared_ptr<DirectReader> reader, std::vector<SparseLayerSpec> layers,
                               int64_t d_model, Format gate, Format up, Format down, Activation act, int64_t capacity,
                               int64_t window)
    : reader_(std::move(reader)), layers_(std::move(layers)), d_model_(d_model), gate_(gate), up_(up), down_(down),
      act_(act), capacity_(capacity), window_(window),
      bounce_(kBounceBytes) {
  if (capacity_ < 1) throw std::invalid_argument("neuron cache: capacity must be >= 1");
  if (window_ < 0) throw std::invalid_argument("neuron cache: window must be >= 0");
  for (const SparseLayerSpec& s : layers_) {
    const Format layer_down = s.has_down ? s.down : down_;
    const size_t bundle = bundle_bytes(gate_, up_, layer_down, d_model_);
    if (s.stride < bundle || s.arena_offset < 0 || s.n_neurons() < 1)
      throw std::invalid_argument("neuron cache: arena geometry does not match the bundle formats");
    if (s.stride + kIoAlignment * 2 > kBounceBytes)
      throw std::invalid_argument("neuron cache: a neuron bundle is larger than the read buffer");
    std::vector<bool> seen(static_cast<size_t>(s.n_neurons()), false);
    for (const int32_t slot : s.file_slot_of_neuron) {
      if (slot < 0 || slot >= s.n_neurons() || seen[slot])
        throw std::invalid_argument("neuron cache: the arena order is not a permutation of the neurons");
      seen[slot] = true;
    }
    Cache c;
    c.down = layer_down;
    c.bundle = bundle;
    c.arena = AlignedBuffer(static_cast<size_t>(capacity_) * bundle);
    c.neuron_of.assign(static_cast<size_t>(capacity_), -1);
    c.slot_of.assign(static_cast<size_t>(s.n_neurons()), -1);
    c.last_used.assign(static_cast<size_t>(capacity_), 0);
    caches_.push_back(std::move(c));
    mark_.resize(std::max(mark_.size(), static_cast<size_t>(s.n_neurons())), 0);
  }
}

size_t NeuronCacheFfn::cache_bytes() const {
  size_t n = bounce_.size();
  for (const Cache& c : caches_) n += c.arena.size();
  return n;
}

void NeuronCacheFfn::predict(const SparseLayerSpec& s, const LayerWeights& w, const float* x, int64_t n,
                             std::vector<int32_t>* active) {
  // t = A x: [n, rank]; p = B t: [n, n_neurons]; active = union over tokens of |act(p)| > threshold.
  if (!w.pred_a.data || !w.pred_b.data || w.pred_a.cols != d_model_ || w.pred_b.rows != s.n_neurons() ||
      w.pred_b.cols != w.pred_a.rows)
    throw KernelError("sparse FFN: the layer's predictor is missing or has the wrong shape");
  const int64_t rank = w.pred_a.rows;
  t_.resize(static_cast<size_t>(n * rank));
  p_.resize(static_cast<size_t>(n * s.n_neurons()));
  matmul(w.pred_a, x, n, t_.data(), ActPrecision::f32);
  matmul(w.pred_b, t_.data(), n, p_.data(), ActPrecision::f32);
  active->clear();
  for (int64_t neuron = 0; neuron < s.n_neurons(); ++neuron)
    for (int64_t i = 0; i < n; ++i)
      if (std::fabs(activation(p_[i * s.n_neurons() + neuron], act_)) > s.pred_threshold) {
        active->push_back(static_cast<int32_t>(neuron));
        break;
      }
}

void NeuronCacheFfn::evict_slot(Cache& c, int64_t slot) {
  // Swap with the last occupied slot so occupied slots stay a prefix.
  const int64_t last = c.used - 1;
  c.slot_of[c.neuron_of[slot]] = -1;
  if (slot != last) {
    std::memcpy(c.arena.data() + slot * c.bundle, c.arena.data() + last * c.bundle, c.bundle);
    c.neuron_of[slot] = c.neuron_of[last];
    c.last_used[slot] = c.last_used[last];
    c.slot_of[c.neuron_of[slot]] = static_cast<int32_t>(slot);
  }
  c.neuron_of[last] = -1;
  --c.used;
  ++stats_.evicted;
}

void NeuronCacheFfn::evict_stale(Cache& c) {
  // Keep the union of the neurons needed in the last `window` steps (window 0: none of them).
  for (int64_t slot = c.used - 1; slot >= 0; --slot)
    if (c.last_used[slot] + static_cast<uint64_t>(window_) < step_) evict_slot(c, slot);
}

void NeuronCacheFfn::load(const SparseLayerSpec& s, Cache& c, const std::vector<int32_t>& neurons) {
  // Read each neuron's bundle from the file: sort by file slot, merge into page runs, read a
  // batch of runs in parallel into the bounce buffer, copy the bundles into cache slots.
  std::vector<std::pair<int64_t, int32_t>> order;  // (file slot, neuron)
  order.reserve(neurons.size());
  for (int32_t neuron : neurons) order.emplace_back(s.file_slot_of_neuron[neuron], neuron);
  std::sort(order.begin(), order.end());
  size_t i = 0;
  while (i < order.size()) {
    struct Run { int64_t start, end; size_t first, last; };  // pages [start, end), neurons [first, last)
    std::vector<Run> runs;
    size_t used = 0;
    size_t j = i;
    while (j < order.size()) {
      const int64_t begin = s.arena_offset + order[j].first * static_cast<int64_t>(s.stride);
      const int64_t start = align_down(begin), end = static_cast<int64_t>(align_up(begin + c.bundle));
      if (!runs.empty() && start <= runs.back().end) {  // touches the previous run: extend it
        const size_t grow = static_cast<size_t>(std::max<int64_t>(0, end - runs.back().end));
        if (used + grow > bounce_.size()) break;
        runs.back().end = std::max(runs.back().end, end);
        runs.back().last = j + 1;
        used += grow;
      } else {
        if (used + static_cast<size_t>(end - start) > bounce_.size()) break;
        runs.push_back(Run{start, end, j, j + 1});
        used += static_cast<size_t>(end - start);
      }
      ++j;
    }
    std::vector<uint64_t> tickets;
    std::vector<size_t> at;
    size_t offset = 0;
    for (const Run& r : runs) {
      at.push_back(offset);
      tickets.push_back(reader_->submit(r.start, static_cast<size_t>(r.end - r.start), bounce_.data() + offset));
      offset += static_cast<size_t>(r.end - r.start);
      const size_t pages = static_cast<size_t>(r.end - r.start) / kIoAlignment;
      ++stats_.read_pages[std::min(pages, stats_.read_pages.size() - 1)];
      ++stats_.reads;
    }
    for (uint64_t t : tickets) reader_->wait(t);
    stats_.bytes_read += offset;
    for (size_t k = 0; k < runs.size(); ++k)
      for (size_t q = runs[k].first; q < runs[k].last; ++q) {
        const int64_t begin = s.arena_offset + order[q].first * static_cast<int64_t>(s.stride);
        const int32_t neuron = order[q].second;
        const int64_t slot = c.used++;
        std::memcpy(c.arena.data() + slot * c.bundle, bounce_.data() + at[k] + (begin - runs[k].start), c.bundle);
        c.neuron_of[slot] = neuron;
        c.slot_of[neuron] = static_cast<int32_t>(slot);
        c.last_used[slot] = step_;
        ++stats_.loaded;
      }
    i = j;
  }
}

void NeuronCacheFfn::compute(int64_t layer, const LayerWeights& w, const float* x, int64_t n, float* out) {
  const SparseLayerSpec& s = layers_[layer];
  Cache& c = caches_[layer];
  if (layer == 0) {
    ++step_;
    ++stats_.passes;
    stats_.tokens += static_cast<uint64_t>(n);
  }
  predict(s, w, x, n, &active_);
  stats_.predicted += active_.size();
  stats_.lookups += active_.size();
  evict_stale(c);
  std::fill(out, out + n * d_model_, 0.0f);
  if (active_.empty()) return;
  thresholds_.assign(static_cast<size_t>(n), s.act_threshold);
  // Cached neurons first, so a round that cannot hold every active neuron uses the hits.
  std::stable_partition(active_.begin(), active_.end(), [&](int32_t neuron) { return c.slot_of[neuron] >= 0; });
  // Rounds of at most `capacity` neurons (one round unless the active set outgrows the cache).
  bool accumulate = false;
  for (size_t first = 0; first < active_.size();) {
    const size_t last = std::min(active_.size(), first + static_cast<size_t>(capacity_));
    ++stamp_;
    missing_.clear();
    for (size_t k = first; k < last; ++k) {
      const int32_t neuron = active_[k];
      mark_[neuron] = stamp_;
      const int32_t slot = c.slot_of[neuron];
      if (slot >= 0) {
        c.last_used[slot] = step_;
        ++stats_.hits;
      } else {
        missing_.push_back(neuron);
      }
    }
    // Make room: evict the least recently used neurons this round does not need, chosen in one
    // pass (a scan per victim costs capacity x misses when the cache turns over).
    const int64_t excess = c.used + static_cast<int64_t>(missing_.size()) - capacity_;
    if (excess > 0) {
      victims_.clear();
      for (int64_t slot = 0; slot < c.used; ++slot)
        if (mark_[c.neuron_of[slot]] != stamp_) victims_.push_back(slot);
      // a round never exceeds the capacity, so there are at least `excess` candidates
      std::nth_element(victims_.begin(), victims_.begin() + (excess - 1), victims_.end(),
                       [&](int64_t a, int64_t b) { return c.last_used[a] < c.last_used[b]; });
      victims_.resize(static_cast<size_t>(excess));
      // Highest slot first: swap-with-last then never moves a victim still to be evicted.
      std::sort(victims_.begin(), victims_.end(), std::greater<int64_t>());
      for (int64_t slot : victims_) evict_slot(c, slot);
    }
    load(s, c, missing_);
    slots_.clear();
    for (size_t k = first; k < last; ++k) slots_.push_back(c.slot_of[active_[k]]);
    NeuronArena arena;
    arena.data = c.arena.data();
    arena.size_bytes = c.arena.size();
    arena.n_slots = capacity_;
    arena.d_model = d_model_;
    arena.gate = gate_;
    arena.up = up_;
    arena.down = c.down;
    arena.stride = c.bundle;
    ffn_sparse(arena, x, n, slots_.data(), static_cast<int64_t>(slots_.size()), act_,
               s.act_threshold > 0.0f ? thresholds_.data() : nullptr, out, accumulate);
    accumulate = true;
    first = last;
  }
}

}  // namespace ef::memory
