// Sparse FFN over a neuron-bundle arena. Slots are split into chunks; per chunk the gate dot
// products of all tokens run as one small GEMM (rows gathered by slot index), then the up dot
// products of the neurons that survive the threshold, then each neuron's down column is added,
// scaled by its activation, into a per-thread partial output that is summed at the end.
#include <algorithm>
#include <cmath>
#include <string>

#include "kernel_table.h"
#include "scratch.h"

namespace ef {

size_t bundle_bytes(Format gate, Format up, Format down, int64_t d_model) {
  return row_bytes(gate, d_model) + row_bytes(up, d_model) + row_bytes(down, d_model);
}

namespace {

void check_arena(const NeuronArena& a) {
  if (!a.data) throw KernelError("ffn_sparse: arena buffer is null");
  if (a.n_slots <= 0) throw KernelError("ffn_sparse: the arena must have at least one slot");
  check_cols(a.gate, a.d_model, "ffn_sparse gate");
  check_cols(a.up, a.d_model, "ffn_sparse up");
  check_cols(a.down, a.d_model, "ffn_sparse down");
  const size_t bundle = bundle_bytes(a.gate, a.up, a.down, a.d_model);
  const size_t stride = a.stride ? a.stride : bundle;
  if (stride < bundle)
    throw KernelError("ffn_sparse: arena stride " + std::to_string(stride) + " is below the bundle size " +
                      std::to_string(bundle));
  const size_t need = static_cast<size_t>(a.n_slots - 1) * stride + bundle;
  if (a.size_bytes < need)
    throw KernelError("ffn_sparse: arena holds " + std::to_string(a.size_bytes) + " bytes, " +
                      std::to_string(a.n_slots) + " slots need " + std::to_string(need));
}

constexpr int64_t kMaxChunk = 64;  // slots per task

// |act(g)|, the magnitude a threshold is tested on (CATS). The pre-activation |g| is not a stand-in
// for it under SiLU: a strongly negative gate gives almost nothing, a positive one of the same size
// the most (Qwen2.5-Coder-1.5B's layer 1: a fifth of its |g| lie below 4.5, where silu reaches 4.4).
float act_magnitude(float g, Activation act) {
  if (act == Activation::silu) return std::fabs(g / (1.0f + std::exp(-g)));
  const float c = 0.7978845608f;  // sqrt(2 / pi)
  return std::fabs(0.5f * g * (1.0f + std::tanh(c * (g + 0.044715f * g * g * g))));
}

// Requests the bundles of slots ids[0, count) into cache: part `k` of `parts` of their lines, so the
// requests for the next chunk are spread over the steps of this one. A chunk's bundles lie `stride`
// apart (gathered, or every neuron of a dense FFN in a row): the hardware prefetcher does not follow
// the 16 interleaved row streams a gathered GEMM reads, and without these requests the arena ran at
// 2-3 GB/s against 12-14 GB/s for the same bytes as dense matrices.
void prefetch_bundles(const uint8_t* base, size_t stride, size_t bundle, const int32_t* ids, int64_t count, int k,
                      int parts) {
  const size_t lines = (bundle + 63) / 64;
  const int64_t total = count * static_cast<int64_t>(lines);
  const int64_t begin = total * k / parts, end = total * (k + 1) / parts;
  for (int64_t i = begin; i < end; ++i) {
    const int64_t b = i / static_cast<int64_t>(lines), l = i % static_cast<int64_t>(lines);
    __builtin_prefetch(base + static_cast<size_t>(ids[b]) * stride + static_cast<size_t>(l) * 64, 0, 3);
  }
}

int32_t* scratch_ints(size_t n) {
  thread_local std::vector<int32_t> buf;
  if (buf.size() < n) buf.resize(n);
  return buf.data();
}

}  // namespace

void ffn_sparse(const NeuronArena& arena, const float* x, int64_t n_tok, const int32_t* slots, int64_t n_active,
                Activation act, const float* thresholds, float* out, bool accumulate) {
  check_arena(arena);
  if (!x || !out) throw KernelError("ffn_sparse: input or output buffer is null");
  if (n_tok <= 0) throw KernelError("ffn_sparse: the number of tokens must be positive, got " + std::to_string(n_tok));
  if (n_active < 0) throw KernelError("ffn_sparse: the number of active slots must be >= 0");
  if (n_active > 0 && !slots) throw KernelError("ffn_sparse: the slot list is null");
  if (act != Activation::silu && act != Activation::gelu_tanh) throw KernelError("ffn_sparse: unknown activation");
  for (int64_t i = 0; i < n_active; ++i)
    if (slots[i] < 0 || slots[i] >= arena.n_slots)
      throw KernelError("ffn_sparse: slot " + std::to_string(slots[i]) + " at position " + std::to_string(i) +
                        " is outside the arena [0, " + std::to_string(arena.n_slots) + ")");
  const int64_t dm = arena.d_model;
  if (!accumulate) std::fill(out, out + n_tok * dm, 0.0f);
  if (n_active == 0) return;

  const KernelTable& kt = kernels();
  const size_t rb_g = row_bytes(arena.gate, dm), rb_u = row_bytes(arena.up, dm);
  const size_t stride = arena.stride ? arena.stride : bundle_bytes(arena.gate, arena.up, arena.down, dm);
  const bool need_q8 = format_info(arena.gate).quantized || format_info(arena.up).quantized;
  thread_local QuantizedActs xq;
  if (need_q8) xq.quantize(x, n_tok, dm);
  const Q8View xv = q8_view(xq);

  // Dot products of rows gathered by slot id: y[t * ldy + r] for r < count.
  auto dots = [&](Format fmt, size_t offset, const int32_t* ids, int64_t count, float* y) {
    const RowsView v{arena.data + offset, stride, ids, dm};
    if (format_info(fmt).quantized)
      kt.gemm_q8[int(fmt)].fn(v, 0, count, xv, 0, n_tok, y, count);
    else
      kt.gemm_f32[int(fmt)].fn(v, 0, count, x, 0, n_tok, y, count);
  };

  const int threads = get_num_threads();
  const int64_t chunk = std::clamp<int64_t>((n_active + 2 * threads - 1) / (2 * threads), 8, kMaxChunk);
  const int64_t tasks = (n_active + chunk - 1) / chunk;
  // One partial sum per worker share, owned by the calling thread; `used` marks the ones written.
  // Share k takes chunks k, k + threads, ...: a fixed grouping, so the sum is the same whichever
  // thread runs which share (the approximate FFN thresholds its result: it must not jitter).
  thread_local std::vector<float> partial;
  thread_local std::vector<uint8_t> used;
  if (partial.size() < static_cast<size_t>(threads * n_tok * dm)) partial.resize(static_cast<size_t>(threads * n_tok * dm));
  used.assign(static_cast<size_t>(threads), 0);
  float* partial_base = partial.data();
  uint8_t* used_base = used.data();

  const size_t bundle = bundle_bytes(arena.gate, arena.up, arena.down, dm);
  auto one_chunk = [&](int64_t task, int64_t th) {
    const int64_t s0 = task * chunk, cnt = std::min(n_active, s0 + chunk) - s0;
    // This share's next chunk, requested a third at a time while this one computes.
    const int64_t next0 = (task + threads) * chunk, next_cnt = std::max<int64_t>(0, std::min(n_active, next0 + chunk) - next0);
    auto prefetch_next = [&](int k) {
      if (next_cnt > 0) prefetch_bundles(arena.data, stride, bundle, slots + next0, next_cnt, k, 3);
    };
    float* part = partial_base + th * n_tok * dm;
    if (!used_base[th]) {
      std::fill(part, part + n_tok * dm, 0.0f);
      used_base[th] = 1;
    }
    float* g = scratch_floats(static_cast<size_t>(cnt * n_tok), 1);   // [n_tok, cnt] gate
    float* u = scratch_floats(static_cast<size_t>(cnt * n_tok), 2);   // [n_tok, live] up, then h
    float* gl = scratch_floats(static_cast<size_t>(cnt * n_tok), 3);  // [n_tok, live] gate of live
    float* bsum = scratch_floats(down_scratch_floats(n_tok, dm), 0);
    int32_t* live = scratch_ints(static_cast<size_t>(2 * cnt));      // slot ids, then their column in g
    prefetch_next(0);
    dots(arena.gate, 0, slots + s0, cnt, g);
    prefetch_next(1);
    int64_t n_live = 0;
    for (int64_t r = 0; r < cnt; ++r) {
      bool any = thresholds == nullptr;
      for (int64_t t = 0; t < n_tok && !any; ++t) any = act_magnitude(g[t * cnt + r], act) >= thresholds[t];
      if (any) live[n_live] = slots[s0 + r], live[cnt + n_live] = static_cast<int32_t>(r), ++n_live;
    }
    if (n_live == 0) {
      prefetch_next(2);
      return;
    }
    dots(arena.up, rb_g, live, n_live, u);
    prefetch_next(2);
    // gate values of the live neurons; below-threshold (neuron, token) pairs contribute 0 = act(0)
    for (int64_t t = 0; t < n_tok; ++t)
      for (int64_t i = 0; i < n_live; ++i) {
        const float gv = g[t * cnt + live[cnt + i]];
        gl[t * n_live + i] = (thresholds && act_magnitude(gv, act) < thresholds[t]) ? 0.0f : gv;
      }
    kt.gated_act[int(act)].fn(gl, u, u, n_tok * n_live);  // h = act(gate) * up, [n_tok, live]
    const uint8_t* rows[kMaxChunk];
    for (int64_t i = 0; i < n_live; ++i) rows[i] = arena.data + static_cast<size_t>(live[i]) * stride + rb_g + rb_u;
    kt.ffn_down[int(arena.down)].fn(rows, u, n_live, n_tok, dm, part, bsum);
  };
  ThreadPool::global().run(std::min<int64_t>(threads, tasks), [&](int64_t share, int) {
    for (int64_t task = share; task < tasks; task += threads) one_chunk(task, share);
  });
  for (int th = 0; th < threads; ++th) {
    if (!used[th]) continue;
    const float* part = partial.data() + th * n_tok * dm;
    for (int64_t i = 0; i < n_tok * dm; ++i) out[i] += part[i];
  }
}

}  // namespace ef
