#include "neuron_cache.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <stdexcept>

namespace ef::memory {
namespace {

constexpr size_t kBounceBytes = 2 << 20;  // two batches of neuron reads (1 MiB each)

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
    if (s.stride + kIoAlignment * 2 > kBounceBytes / 2)
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
    std::vector<int32_t> inverse(static_cast<size_t>(s.n_neurons()));
    for (int64_t n = 0; n < s.n_neurons(); ++n) inverse[s.file_slot_of_neuron[n]] = static_cast<int32_t>(n);
    neuron_of_file_slot_.push_back(std::move(inverse));
  }
}

void NeuronCacheFfn::set_chunks(int64_t chunk, float keep, int64_t resident) {
  if (chunk < 0 || keep < 0.0f || keep > 1.0f || resident < 0)
    throw std::invalid_argument("neuron cache: chunk >= 0, keep in [0, 1] and resident >= 0 are needed");
  if (resident > capacity_ / 2) throw std::invalid_argument("neuron cache: resident neurons take at most half the cache");
  if (step_ > 0) throw std::invalid_argument("neuron cache: chunks are set before the first pass");
  chunk_ = chunk, keep_ = keep, resident_ = resident;
  for (size_t layer = 0; layer < layers_.size(); ++layer) {
    const SparseLayerSpec& s = layers_[layer];
    Cache& c = caches_[layer];
    const int64_t n = std::min<int64_t>(resident_, s.n_neurons());
    std::vector<int32_t> hot(neuron_of_file_slot_[layer].begin(), neuron_of_file_slot_[layer].begin() + n);
    load(s, c, hot);
    c.pinned = c.used;
  }
}

void NeuronCacheFfn::select_chunks(const SparseLayerSpec& s, int64_t n, std::vector<int32_t>* active) {
  // p_ holds the predicted pre-activations [n, n_neurons]; a chunk's score is its largest (over the
  // batch's tokens) sum of predicted |act|. The resident prefix is always used (it costs no read).
  const int64_t N = s.n_neurons();
  const std::vector<int32_t>& neuron_of = neuron_of_file_slot_[&s - layers_.data()];
  const int64_t n_chunks = (N + chunk_ - 1) / chunk_;
  const int64_t first = std::min(n_chunks, resident_ / chunk_);  // chunks wholly resident
  score_.assign(static_cast<size_t>(n_chunks), 0.0f);
  for (int64_t ch = first; ch < n_chunks; ++ch) {
    const int64_t a = ch * chunk_, b = std::min(N, a + chunk_);
    float best = 0.0f;
    for (int64_t t = 0; t < n; ++t) {
      const float* p = p_.data() + t * N;
      float sum = 0.0f;
      for (int64_t slot = a; slot < b; ++slot) sum += std::fabs(activation(p[neuron_of[slot]], act_));
      best = std::max(best, sum);
    }
    score_[ch] = best;
  }
  const int64_t want = std::clamp<int64_t>(static_cast<int64_t>(std::lround(keep_ * n_chunks)) - first, 0, n_chunks - first);
  ranked_.resize(static_cast<size_t>(n_chunks - first));
  for (int64_t ch = first; ch < n_chunks; ++ch) ranked_[ch - first] = ch;
  if (want < static_cast<int64_t>(ranked_.size()))
    std::nth_element(ranked_.begin(), ranked_.begin() + want, ranked_.end(),
                     [&](int64_t x, int64_t y) { return score_[x] > score_[y]; });
  ranked_.resize(static_cast<size_t>(want));
  std::sort(ranked_.begin(), ranked_.end());  // file order: neighbours merge into one read
  active->clear();
  for (int64_t slot = 0; slot < std::min(N, first * chunk_); ++slot) active->push_back(neuron_of[slot]);
  for (int64_t ch : ranked_)
    for (int64_t slot = ch * chunk_; slot < std::min(N, (ch + 1) * chunk_); ++slot) active->push_back(neuron_of[slot]);
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
  if (chunk_ > 0) {
    select_chunks(s, n, active);
    return;
  }
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
  for (int64_t slot = c.used - 1; slot >= c.pinned; --slot)
    if (c.last_used[slot] + static_cast<uint64_t>(window_) < step_) evict_slot(c, slot);
}

void NeuronCacheFfn::plan_batches(const SparseLayerSpec& s, const Cache& c, const std::vector<int32_t>& neurons) {
  // Sort by file slot and merge into page runs; a batch holds runs up to half the bounce buffer.
  order_.clear();
  for (int32_t neuron : neurons) order_.emplace_back(s.file_slot_of_neuron[neuron], neuron);
  std::sort(order_.begin(), order_.end());
  batches_.clear();
  const size_t half = bounce_.size() / 2;
  size_t used = 0;
  for (size_t j = 0; j < order_.size(); ++j) {
    const int64_t begin = s.arena_offset + order_[j].first * static_cast<int64_t>(s.stride);
    const int64_t start = align_down(begin), end = static_cast<int64_t>(align_up(begin + c.bundle));
    if (!batches_.empty() && !batches_.back().runs.empty()) {
      Run& last = batches_.back().runs.back();
      if (start <= last.end) {  // touches the previous run: extend it if the batch has room
        const size_t grow = static_cast<size_t>(std::max<int64_t>(0, end - last.end));
        if (used + grow <= half) {
          last.end = std::max(last.end, end);
          last.last = j + 1;
          used += grow;
          continue;
        }
      }
    }
    if (batches_.empty() || used + static_cast<size_t>(end - start) > half) {
      batches_.emplace_back();
      used = 0;
    }
    batches_.back().runs.push_back(Run{start, end, j, j + 1});
    used += static_cast<size_t>(end - start);
  }
}

void NeuronCacheFfn::submit(Batch& b, uint8_t* buffer) {
  b.tickets.clear();
  size_t offset = 0;
  for (const Run& r : b.runs) {
    b.tickets.push_back(reader_->submit(r.start, static_cast<size_t>(r.end - r.start), buffer + offset));
    offset += static_cast<size_t>(r.end - r.start);
    const size_t pages = static_cast<size_t>(r.end - r.start) / kIoAlignment;
    ++stats_.read_pages[std::min(pages, stats_.read_pages.size() - 1)];
    ++stats_.reads;
  }
  stats_.bytes_read += offset;
}

void NeuronCacheFfn::finish(const SparseLayerSpec& s, Cache& c, Batch& b, const uint8_t* buffer,
                            std::vector<int32_t>* slots) {
  for (uint64_t t : b.tickets) reader_->wait(t);
  size_t at = 0;
  for (const Run& r : b.runs) {
    for (size_t q = r.first; q < r.last; ++q) {
      const int64_t begin = s.arena_offset + order_[q].first * static_cast<int64_t>(s.stride);
      const int32_t neuron = order_[q].second;
      const int64_t slot = c.used++;
      std::memcpy(c.arena.data() + slot * c.bundle, buffer + at + (begin - r.start), c.bundle);
      c.neuron_of[slot] = neuron;
      c.slot_of[neuron] = static_cast<int32_t>(slot);
      c.last_used[slot] = step_;
      ++stats_.loaded;
      if (slots) slots->push_back(static_cast<int32_t>(slot));
    }
    at += static_cast<size_t>(r.end - r.start);
  }
}

void NeuronCacheFfn::load(const SparseLayerSpec& s, Cache& c, const std::vector<int32_t>& neurons) {
  plan_batches(s, c, neurons);
  for (Batch& b : batches_) {
    submit(b, bounce_.data());
    finish(s, c, b, bounce_.data(), nullptr);
  }
}

void NeuronCacheFfn::run_kernel(const Cache& c, const SparseLayerSpec& s, const float* x, int64_t n,
                                const std::vector<int32_t>& slots, float* out, bool* accumulate) {
  if (slots.empty()) return;
  NeuronArena arena;
  arena.data = c.arena.data();
  arena.size_bytes = c.arena.size();
  arena.n_slots = capacity_;
  arena.d_model = d_model_;
  arena.gate = gate_;
  arena.up = up_;
  arena.down = c.down;
  arena.stride = c.bundle;
  ffn_sparse(arena, x, n, slots.data(), static_cast<int64_t>(slots.size()), act_,
             s.act_threshold > 0.0f ? thresholds_.data() : nullptr, out, *accumulate);
  *accumulate = true;
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
  // Rounds of at most `capacity - pinned` neurons (one round unless the active set outgrows the
  // cache): a round's misses then always find that many unpinned slots it does not need.
  bool accumulate = false;
  for (size_t first = 0; first < active_.size();) {
    const size_t last = std::min(active_.size(), first + static_cast<size_t>(capacity_ - c.pinned));
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
      for (int64_t slot = c.pinned; slot < c.used; ++slot)
        if (mark_[c.neuron_of[slot]] != stamp_) victims_.push_back(slot);
      // a round never exceeds the capacity, so there are at least `excess` candidates
      std::nth_element(victims_.begin(), victims_.begin() + (excess - 1), victims_.end(),
                       [&](int64_t a, int64_t b) { return c.last_used[a] < c.last_used[b]; });
      victims_.resize(static_cast<size_t>(excess));
      // Highest slot first: swap-with-last then never moves a victim still to be evicted.
      std::sort(victims_.begin(), victims_.end(), std::greater<int64_t>());
      for (int64_t slot : victims_) evict_slot(c, slot);
    }
    // The hits compute while the misses are read; each batch of misses computes while the next
    // one is read (two halves of the bounce buffer).
    slots_.clear();
    for (size_t k = first; k < last; ++k)
      if (c.slot_of[active_[k]] >= 0) slots_.push_back(c.slot_of[active_[k]]);
    plan_batches(s, c, missing_);
    uint8_t* halves[2] = {bounce_.data(), bounce_.data() + bounce_.size() / 2};
    if (!batches_.empty()) submit(batches_[0], halves[0]);
    run_kernel(c, s, x, n, slots_, out, &accumulate);
    for (size_t b = 0; b < batches_.size(); ++b) {
      // the other half is free: the batch before this one was copied into the cache
      if (b + 1 < batches_.size()) submit(batches_[b + 1], halves[(b + 1) % 2]);
      loaded_slots_.clear();
      finish(s, c, batches_[b], halves[b % 2], &loaded_slots_);
      run_kernel(c, s, x, n, loaded_slots_, out, &accumulate);
    }
    first = last;
  }
}

}  // namespace ef::memory
