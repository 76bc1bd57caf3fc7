// Entry points for norms, RoPE, gated activations, softmax, argmax and top-k.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "kernel_table.h"
#include "rope_freq.h"
#include "scratch.h"

namespace ef {
namespace {

void check_nd(const void* x, const void* y, int64_t n, int64_t d, const char* what) {
  if (!x || !y) throw KernelError(std::string(what) + ": buffer is null");
  if (n <= 0 || d <= 0)
    throw KernelError(std::string(what) + ": shape must be positive, got [" + std::to_string(n) + ", " +
                      std::to_string(d) + "]");
}

// Parallel over rows when there is enough work to pay for waking the pool.
template <class F>
void over_rows(int64_t n, int64_t d, F&& f) {
  if (n == 1 || n * d < (1 << 16)) {
    f(0, n);
    return;
  }
  const int64_t tasks = std::min<int64_t>(n, 4 * get_num_threads());
  ThreadPool::global().run(tasks, [&](int64_t task, int) {
    int64_t b, e;
    split_range(n, tasks, task, &b, &e);
    f(b, e);
  });
}

}  // namespace

void rms_norm(const float* x, const float* w, float* y, int64_t n, int64_t d, float eps) {
  check_nd(x, y, n, d, "rms_norm");
  if (!w) throw KernelError("rms_norm: weight is null");
  if (!(eps >= 0.0f)) throw KernelError("rms_norm: eps must be >= 0");
  const RmsNormFn fn = kernels().rms_norm.fn;
  over_rows(n, d, [&](int64_t b, int64_t e) { fn(x + b * d, w, y + b * d, e - b, d, eps); });
}

void rope(float* x, int64_t n, int64_t n_heads, int64_t head_dim, const int32_t* positions, const RopeParams& p) {
  if (!x || !positions) throw KernelError("rope: x or positions is null");
  if (n <= 0 || n_heads <= 0 || head_dim <= 0) throw KernelError("rope: shape must be positive");
  if (p.rot_dim <= 0 || p.rot_dim % 2 || p.rot_dim > head_dim)
    throw KernelError("rope: rot_dim must be even and in (0, head_dim=" + std::to_string(head_dim) + "], got " +
                      std::to_string(p.rot_dim));
  if (!(p.theta_base > 0.0f) || !(p.linear_scale > 0.0f)) throw KernelError("rope: theta_base and linear_scale must be positive");
  const int64_t half = p.rot_dim / 2;
  if (p.freq_factors)
    for (int64_t i = 0; i < half; ++i)
      if (!(p.freq_factors[i] > 0.0f)) throw KernelError("rope: freq_factors must be positive, got " + std::to_string(p.freq_factors[i]) + " at " + std::to_string(i));
  // cos / sin per (token, frequency) in double, shared by all heads. The table of the last call
  // for each of two parameter sets (Gemma's local and global layers) is kept: q and k of every
  // layer of a forward pass rotate the same positions, and a prompt's table took as long to make
  // as the rotations themselves.
  struct Table {
    RopeFrequencies fc;
    std::vector<int32_t> positions;
    std::vector<float> cs;
  };
  thread_local Table tables[2];
  thread_local int older = 0;
  Table* table = nullptr;
  for (Table& c : tables)
    if (c.fc.made_from(p) && c.positions.size() == static_cast<size_t>(n) &&
        std::equal(positions, positions + n, c.positions.begin()))
      table = &c;
  if (!table) {
    table = &tables[older];
    older ^= 1;
    if (!table->fc.made_from(p)) table->fc.make(p);
    table->positions.assign(positions, positions + n);
    table->cs.resize(static_cast<size_t>(n * p.rot_dim));
    float* cs = table->cs.data();
    for (int64_t t = 0; t < n; ++t)
      for (int64_t i = 0; i < half; ++i) {
        const double ang = static_cast<double>(positions[t]) * table->fc.inv_freq[i];
        cs[t * p.rot_dim + i] = static_cast<float>(std::cos(ang));
        cs[t * p.rot_dim + half + i] = static_cast<float>(std::sin(ang));
      }
  }
  const float* cs = table->cs.data();
  const RopeApplyFn fn = kernels().rope_apply.fn;
  over_rows(n, n_heads * head_dim, [&](int64_t b, int64_t e) {
    fn(x + b * n_heads * head_dim, e - b, n_heads, head_dim, p.rot_dim, cs + b * p.rot_dim);
  });
}

void gated_act(const float* gate, const float* up, float* out, int64_t count, Activation act) {
  if (!gate || !up || !out) throw KernelError("gated_act: buffer is null");
  if (count <= 0) throw KernelError("gated_act: count must be positive");
  if (act != Activation::silu && act != Activation::gelu_tanh) throw KernelError("gated_act: unknown activation");
  const GatedActFn fn = kernels().gated_act[int(act)].fn;
  const int64_t block = 4096;
  over_rows((count + block - 1) / block, block, [&](int64_t b, int64_t e) {
    const int64_t lo = b * block, hi = std::min(count, e * block);
    fn(gate + lo, up + lo, out + lo, hi - lo);
  });
}

void softmax(const float* x, float* y, int64_t n, int64_t d) {
  check_nd(x, y, n, d, "softmax");
  const SoftmaxFn fn = kernels().softmax.fn;
  over_rows(n, d, [&](int64_t b, int64_t e) { fn(x + b * d, y + b * d, e - b, d); });
}

void to_half(const float* x, int64_t n, uint16_t* out) {
  if (!x || !out) throw KernelError("to_half: buffer is null");
  if (n < 0) throw KernelError("to_half: n must be >= 0");
  kernels().to_half.fn(x, n, out);
}

void argmax(const float* x, int64_t n, int64_t d, int32_t* out) {
  check_nd(x, out, n, d, "argmax");
  const ArgmaxFn fn = kernels().argmax.fn;
  if (n == 1 && d >= (1 << 16) && get_num_threads() > 1) {
    // One long row (a vocabulary): split it, then keep the first of the largest.
    const int64_t parts = get_num_threads();
    std::vector<int64_t> best(static_cast<size_t>(parts));
    ThreadPool::global().run(parts, [&](int64_t p, int) {
      int64_t b, e;
      split_range(d, parts, p, &b, &e);
      best[p] = b + fn(x + b, e - b);
    });
    int64_t bi = best[0];
    for (int64_t p = 1; p < parts; ++p)
      if (x[best[p]] > x[bi]) bi = best[p];
    out[0] = static_cast<int32_t>(bi);
    return;
  }
  over_rows(n, d, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) out[t] = fn(x + t * d, d);
  });
}

void topk(const float* x, int64_t n, int64_t d, int64_t k, float* values, int32_t* indices) {
  check_nd(x, values, n, d, "topk");
  if (!indices) throw KernelError("topk: indices buffer is null");
  if (k <= 0 || k > d) throw KernelError("topk: k must be in [1, " + std::to_string(d) + "], got " + std::to_string(k));
  const TopkFn fn = kernels().topk.fn;
  if (n == 1 && d >= (1 << 16) && get_num_threads() > 1) {
    const int64_t parts = get_num_threads();
    std::vector<float> cv(static_cast<size_t>(parts * k));
    std::vector<int32_t> ci(static_cast<size_t>(parts * k));
    std::vector<int64_t> got(static_cast<size_t>(parts));
    ThreadPool::global().run(parts, [&](int64_t p, int) {
      int64_t b, e;
      split_range(d, parts, p, &b, &e);
      got[p] = std::min(k, e - b);
      fn(x + b, e - b, got[p], cv.data() + p * k, ci.data() + p * k);
      for (int64_t i = 0; i < got[p]; ++i) ci[p * k + i] += static_cast<int32_t>(b);
    });
    std::vector<int32_t> all;
    for (int64_t p = 0; p < parts; ++p) all.insert(all.end(), ci.begin() + p * k, ci.begin() + p * k + got[p]);
    std::partial_sort(all.begin(), all.begin() + k, all.end(),
                      [x](int32_t a, int32_t b) { return x[a] > x[b] || (x[a] == x[b] && a < b); });
    for (int64_t i = 0; i < k; ++i) indices[i] = all[i], values[i] = x[all[i]];
    return;
  }
  over_rows(n, d, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) fn(x + t * d, d, k, values + t * k, indices + t * k);
  });
}

}  // namespace ef
