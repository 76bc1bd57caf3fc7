// Decode / verify attention over a slot-addressed KV cache. Work items are (KV head, slot split):
// each runs the ISA chunk kernel over its slots with an online softmax; the splits of one head
// are merged at the end (split-K, so a single KV head still uses every thread at decode).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "kernel_table.h"
#include "kv_kivi.h"
#include "scratch.h"

namespace ef {

size_t kv_row_bytes(Format fmt, int64_t head_dim) {
  if (fmt != Format::f16 && fmt != Format::q8_0)
    throw KernelError(std::string("KV cache vectors of format f16 or q8_0 have a row size, got ") + format_info(fmt).name);
  if (head_dim <= 0 || head_dim % 16)
    throw KernelError("KV cache head_dim must be a positive multiple of 16, got " + std::to_string(head_dim));
  return row_bytes(fmt, head_dim);
}

namespace {

void check_cache(const KvCache& c, const char* what) {
  if (!c.k || !c.v || !c.slot_pos) throw KernelError(std::string(what) + ": KV cache buffers are null");
  if (c.n_kv_heads <= 0 || c.capacity <= 0)
    throw KernelError(std::string(what) + ": KV cache needs positive n_kv_heads and capacity");
  if (c.fmt != Format::f16 && c.fmt != Format::q8_0 && c.fmt != Format::kivi2)
    throw KernelError(std::string("KV cache format must be f16, q8_0 or kivi2, got ") + format_info(c.fmt).name);
  if (c.fmt == Format::kivi2) kivi::check(c, what);
  const size_t need_k = kv_key_bytes(c.fmt, c.n_kv_heads, c.capacity, c.head_dim, c.wraps);
  const size_t need_v = kv_value_bytes(c.fmt, c.n_kv_heads, c.capacity, c.head_dim, c.wraps);
  const size_t have_v = c.v_size_bytes ? c.v_size_bytes : c.size_bytes;
  if (c.size_bytes < need_k || have_v < need_v)
    throw KernelError(std::string(what) + ": KV cache buffers hold " + std::to_string(c.size_bytes) + " and " +
                      std::to_string(have_v) + " bytes, need " + std::to_string(need_k) + " and " +
                      std::to_string(need_v));
}

constexpr int64_t kChunk = 64;     // slots per chunk kernel call
constexpr int64_t kSegment = 256;  // slots per split (a multiple of kChunk: chunks stay aligned)
constexpr int64_t kQueryBlock = 64;  // queries per work item of a long prompt

}  // namespace

void attention(const KvCache& cache, const AttentionArgs& a) {
  check_cache(cache, "attention");
  if (!a.q || !a.out || !a.q_pos) throw KernelError("attention: q, q_pos or out is null");
  if (a.n_q <= 0 || a.n_heads <= 0) throw KernelError("attention: n_q and n_heads must be positive");
  if (a.n_heads % cache.n_kv_heads)
    throw KernelError("attention: n_heads " + std::to_string(a.n_heads) + " is not a multiple of n_kv_heads " +
                      std::to_string(cache.n_kv_heads));
  if (a.window < 0) throw KernelError("attention: window must be >= 0");
  if (!std::isfinite(a.scale) || !(a.softcap >= 0.0f)) throw KernelError("attention: scale must be finite and softcap >= 0");

  const int64_t hd = cache.head_dim, cap = cache.capacity, n_kv = cache.n_kv_heads;
  const int64_t group = a.n_heads / n_kv, n_q = a.n_q, R = group * n_q;
  // A kivi2 cache is read a chunk at a time into f16 vectors for the f16 chunk kernel.
  const bool kivi2 = cache.fmt == Format::kivi2;
  const size_t rb = kivi2 ? static_cast<size_t>(2 * hd) : kv_row_bytes(cache.fmt, hd);
  const AttnChunkFn chunk_fn = kernels().attn_chunk[attn_index(kivi2 ? Format::f16 : cache.fmt)].fn;

  // Live slot range: nothing outside [lo, hi] can be visible.
  int64_t lo = cap, hi = -1;
  for (int64_t j = 0; j < cap; ++j)
    if (cache.slot_pos[j] >= 0) lo = std::min(lo, j), hi = j;
  std::fill(a.out, a.out + n_q * a.n_heads * hd, 0.0f);
  if (hi < 0) return;
  // Splits are fixed segments of the slot space, so how a query's keys are grouped and summed
  // depends only on which slots it sees - not on the other queries of the call or on the thread
  // count. Decoding one token and verifying it inside a tree then give bit-identical results.
  const int64_t first_seg = lo / kSegment, splits = hi / kSegment - first_seg + 1;

  // Per work item: m [R], l [R], acc [R, hd]; q rows of each KV head gathered as [R, hd].
  const int64_t item_floats = R * (hd + 2);
  thread_local std::vector<float> state;
  const size_t need = static_cast<size_t>(n_kv * splits * item_floats + n_kv * R * hd);
  if (state.size() < need) state.resize(need);
  float* states = state.data();
  float* qg = states + n_kv * splits * item_floats;
  for (int64_t g = 0; g < n_kv; ++g)
    for (int64_t r = 0; r < R; ++r) {
      const int64_t i = r / group, h = g * group + r % group;
      std::copy(a.q + (i * a.n_heads + h) * hd, a.q + (i * a.n_heads + h + 1) * hd, qg + (g * R + r) * hd);
    }

  // Items are (KV head, split, block of queries). A prompt's queries are split into blocks so both
  // threads share a long prefill; a chunk runs only the rows of the block's queries that see one of
  // its slots (a causal prompt's early queries skip its later chunks). A row that sees nothing in a
  // chunk would add exact zeros, so skipping it changes no bit, and a row's arithmetic never
  // depends on which block it falls in.
  const int64_t blocks = (n_q + kQueryBlock - 1) / kQueryBlock;
  ThreadPool::global().run(n_kv * splits * blocks, [&](int64_t task, int) {
    const int64_t item = task / blocks, b = task % blocks;
    const int64_t g = item / splits, p = item % splits;
    const int64_t j_begin = std::max(lo, (first_seg + p) * kSegment);
    const int64_t j_end = std::min(hi + 1, (first_seg + p + 1) * kSegment);
    const int64_t i_begin = b * kQueryBlock, i_end = std::min(n_q, i_begin + kQueryBlock);
    const int64_t rows = (i_end - i_begin) * group, row0 = i_begin * group;
    float* m = states + item * item_floats + row0;
    float* l = states + item * item_floats + R + row0;
    float* acc = states + item * item_floats + 2 * R + row0 * hd;
    std::fill(m, m + rows, -std::numeric_limits<float>::infinity());
    std::fill(l, l + rows, 0.0f);
    std::fill(acc, acc + rows * hd, 0.0f);
    float* scratch = scratch_floats(static_cast<size_t>(rows * kChunk + (kChunk + 16) * hd + (kQueryBlock * kChunk + 3) / 4));
    uint8_t* vis = reinterpret_cast<uint8_t*>(scratch + rows * kChunk + (kChunk + 16) * hd);
    for (int64_t j0 = j_begin / kChunk * kChunk; j0 < j_end; j0 += kChunk) {  // chunks at absolute offsets
      // Whole chunks (slots past the live range are invisible): the SIMD blocking of a query's keys
      // must not depend on how many other slots happen to be live.
      const int64_t c = std::min(kChunk, cap - j0);
      int64_t seen_lo = i_end, seen_hi = i_begin - 1;  // the block's queries that see a slot of the chunk
      for (int64_t i = i_begin; i < i_end; ++i) {  // one row per query: its group's heads share it
        const int64_t qp = a.q_pos[i];
        uint8_t* row = vis + (i - i_begin) * c;
        bool any = false;
        for (int64_t j = 0; j < c; ++j) {
          const int64_t sp = cache.slot_pos[j0 + j];
          const bool ok = sp >= 0 && sp <= qp && (a.window == 0 || qp - sp < a.window) &&
                          (!a.mask || a.mask[i * cap + j0 + j]);
          row[j] = ok;
          any |= ok;
        }
        if (any) seen_lo = std::min(seen_lo, i), seen_hi = i;
      }
      if (seen_hi < seen_lo) continue;
      const uint8_t* kc = cache.k + static_cast<size_t>(g * cap + j0) * rb;
      const uint8_t* vc = cache.v + static_cast<size_t>(g * cap + j0) * rb;
      if (kivi2) {
        thread_local std::vector<uint16_t> kivi_rows;
        kivi_rows.resize(static_cast<size_t>(2 * kChunk * hd));
        kivi::rows_f16(cache, g, j0, c, kivi_rows.data(), kivi_rows.data() + kChunk * hd);
        kc = reinterpret_cast<const uint8_t*>(kivi_rows.data());
        vc = reinterpret_cast<const uint8_t*>(kivi_rows.data() + kChunk * hd);
      }
      const int64_t r0 = (seen_lo - i_begin) * group, nr = (seen_hi - seen_lo + 1) * group;
      const AttnChunk args{qg + (g * R + row0 + r0) * hd, nr, hd, kc, vc, rb, c, vis + (seen_lo - i_begin) * c,
                           group, a.scale, a.softcap, m + r0, l + r0, acc + r0 * hd, scratch};
      chunk_fn(args);
    }
  });

  // Merge the splits of each head and normalise.
  for (int64_t g = 0; g < n_kv; ++g) {
    for (int64_t r = 0; r < R; ++r) {
      float mx = -std::numeric_limits<float>::infinity();
      for (int64_t p = 0; p < splits; ++p) mx = std::max(mx, states[(g * splits + p) * item_floats + r]);
      if (mx == -std::numeric_limits<float>::infinity()) continue;  // sees no key: zero row
      const int64_t i = r / group, h = g * group + r % group;
      float* o = a.out + (i * a.n_heads + h) * hd;
      double lsum = 0.0;
      for (int64_t p = 0; p < splits; ++p) {
        const float* st = states + (g * splits + p) * item_floats;
        if (st[r] == -std::numeric_limits<float>::infinity()) continue;
        const float w = std::exp(st[r] - mx);
        lsum += static_cast<double>(st[R + r]) * w;
        const float* acc = st + 2 * R + r * hd;
        for (int64_t k = 0; k < hd; ++k) o[k] += w * acc[k];
      }
      const float inv = static_cast<float>(1.0 / lsum);
      for (int64_t k = 0; k < hd; ++k) o[k] *= inv;
    }
  }
}

void kv_write(const KvCache& cache, const float* k, const float* v, int64_t n, const int32_t* slots,
              const int32_t* positions) {
  check_cache(cache, "kv_write");
  if (!k || !v || !slots || !positions) throw KernelError("kv_write: k, v, slots or positions is null");
  if (n <= 0) throw KernelError("kv_write: nothing to write (n must be positive)");
  for (int64_t i = 0; i < n; ++i) {
    if (slots[i] < 0 || slots[i] >= cache.capacity)
      throw KernelError("kv_write: slot " + std::to_string(slots[i]) + " is outside the cache [0, " +
                        std::to_string(cache.capacity) + ")");
    if (positions[i] < 0) throw KernelError("kv_write: position " + std::to_string(positions[i]) + " is negative");
  }
  if (cache.fmt == Format::kivi2) {
    kivi::write(cache, k, v, n, slots, positions);
    return;
  }
  const int64_t hd = cache.head_dim;
  const size_t rb = kv_row_bytes(cache.fmt, hd);
  // The vector conversion: a prompt writes thousands of rows, and converting them one value at a
  // time took about a third of a prompt's attention time.
  const ToHalfFn half_of = kernels().to_half.fn;
  auto store = [&](uint8_t* dst, const float* src) {
    if (cache.fmt == Format::f16) {
      half_of(src, hd, reinterpret_cast<uint16_t*>(dst));  // rows are 2-byte aligned in the cache
    } else {
      quantize_rows(src, 1, hd, Format::q8_0, dst, rb);
    }
  };
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t h = 0; h < cache.n_kv_heads; ++h) {
      const size_t off = static_cast<size_t>(h * cache.capacity + slots[i]) * rb;
      store(cache.k + off, k + (i * cache.n_kv_heads + h) * hd);
      store(cache.v + off, v + (i * cache.n_kv_heads + h) * hd);
    }
    cache.slot_pos[slots[i]] = positions[i];
  }
}

void kv_read(const KvCache& cache, float* k, float* v) {
  check_cache(cache, "kv_read");
  if (!k || !v) throw KernelError("kv_read: k or v is null");
  const int64_t hd = cache.head_dim, cap = cache.capacity;
  std::vector<uint16_t> kr(static_cast<size_t>(cap * hd)), vr(kr.size());
  for (int64_t g = 0; g < cache.n_kv_heads; ++g) {
    float* ko = k + g * cap * hd;
    float* vo = v + g * cap * hd;
    if (cache.fmt == Format::kivi2) {
      kivi::rows_f16(cache, g, 0, cap, kr.data(), vr.data());
      for (int64_t i = 0; i < cap * hd; ++i) ko[i] = fp16_to_f32(kr[i]), vo[i] = fp16_to_f32(vr[i]);
    } else {
      const size_t rb = kv_row_bytes(cache.fmt, hd);
      for (int64_t j = 0; j < cap; ++j) {
        const uint8_t* kj = cache.k + static_cast<size_t>(g * cap + j) * rb;
        const uint8_t* vj = cache.v + static_cast<size_t>(g * cap + j) * rb;
        for (int64_t e = 0; e < hd; ++e) {
          if (cache.fmt == Format::f16) {
            uint16_t a, b;
            std::memcpy(&a, kj + 2 * e, 2), std::memcpy(&b, vj + 2 * e, 2);
            ko[j * hd + e] = fp16_to_f32(a), vo[j * hd + e] = fp16_to_f32(b);
          } else {  // q8_0: 32-value blocks of an f16 scale and 32 int8 codes
            const int64_t blk = e / 32;
            uint16_t a, b;
            std::memcpy(&a, kj + 34 * blk, 2), std::memcpy(&b, vj + 34 * blk, 2);
            ko[j * hd + e] = fp16_to_f32(a) * static_cast<int8_t>(kj[34 * blk + 2 + e % 32]);
            vo[j * hd + e] = fp16_to_f32(b) * static_cast<int8_t>(vj[34 * blk + 2 + e % 32]);
          }
        }
        if (cache.slot_pos[j] < 0) std::fill(ko + j * hd, ko + (j + 1) * hd, 0.0f), std::fill(vo + j * hd, vo + (j + 1) * hd, 0.0f);
      }
    }
  }
}

}  // namespace ef
