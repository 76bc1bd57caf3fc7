// KIVI's 2-bit KV cache: keys per channel (a key channel's outliers stay in their channel, so a
// scale per channel over a few positions fits them), values per token, the newest positions in
// f16, and the first block of positions (the attention sink most heads put much of their weight
// on) kept in f16 too. Quantization is asymmetric round-to-nearest to 4 levels min + d * {0..3},
// d = (max - min) / 3, with d and min rounded to f16 first and the codes fit to the rounded pair.
#include "kv_kivi.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

namespace ef {
namespace {

constexpr int64_t G = kKiviGroup;       // positions per block; channels per value group
constexpr int64_t GK = kKiviKeyGroup;   // positions per key scale
constexpr int64_t kSub = G / GK;        // key scales per channel in a block
constexpr size_t kValueGroupBytes = 4 + G / 4;  // f16 scale, f16 min, 2-bit codes
constexpr int64_t kMaxHeadDim = 512;    // a key block's scales are read onto the stack

uint16_t load16(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return h;
}
void store16(uint8_t* p, uint16_t h) { std::memcpy(p, &h, 2); }

// n values x[i * stride] -> f16 scale, f16 min, codes (value i at bits 2 * (i % 4) of codes[i / 4]).
void quantize_group(const float* x, int64_t stride, int64_t n, uint16_t* d_out, uint16_t* m_out, uint8_t* codes) {
  float lo = x[0], hi = x[0];
  for (int64_t i = 1; i < n; ++i) lo = std::min(lo, x[i * stride]), hi = std::max(hi, x[i * stride]);
  const uint16_t dh = f32_to_fp16((hi - lo) / 3.0f), mh = f32_to_fp16(lo);
  const float d = fp16_to_f32(dh), m = fp16_to_f32(mh);
  const float inv = d > 0.0f ? 1.0f / d : 0.0f;
  std::memset(codes, 0, static_cast<size_t>(n / 4));
  for (int64_t i = 0; i < n; ++i) {
    const float q = std::nearbyint((x[i * stride] - m) * inv);
    const int c = q <= 0.0f ? 0 : q >= 3.0f ? 3 : static_cast<int>(q);
    codes[i / 4] |= static_cast<uint8_t>(c << (2 * (i % 4)));
  }
  *d_out = dh, *m_out = mh;
}

int code_at(const uint8_t* codes, int64_t i) { return (codes[i / 4] >> (2 * (i % 4))) & 3; }

// One KV head's part of K: [key store][sink][ring]; of V: [value store][sink][ring].
// A key block (G positions): f16 scale [hd][kSub], f16 min [hd][kSub], codes [hd][G / 4].
// A cache that never wraps has no store for block 0 (its positions stay in the sink).
struct KiviLayout {
  int64_t hd, cap, recent;
  bool wraps;
  int64_t first() const { return wraps ? 0 : 1; }  // slot block of the store's first block
  size_t key_block() const { return static_cast<size_t>(hd) * (4 * kSub + G / 4); }
  size_t value_row() const { return static_cast<size_t>(hd / G) * kValueGroupBytes; }
  size_t key_store() const { return static_cast<size_t>(cap / G - first()) * key_block(); }
  size_t value_store() const { return static_cast<size_t>(cap - first() * G) * value_row(); }
  size_t f16_part() const { return static_cast<size_t>((G + recent) * hd) * 2; }  // sink and ring
  size_t key_head() const { return key_store() + f16_part(); }
  size_t value_head() const { return value_store() + f16_part(); }
};

KiviLayout layout(int64_t capacity, int64_t head_dim, bool wraps) {
  return {head_dim, capacity, kv_recent_slots(capacity), wraps};
}

struct HeadView {  // one KV head: where its keys' and values' parts start
  const KvCache& c;
  const KiviLayout& l;
  int64_t h;
  uint8_t* key_store() const { return c.k + h * l.key_head(); }
  uint8_t* value_store() const { return c.v + h * l.value_head(); }
  uint8_t* key_f16(int64_t i) const { return key_store() + l.key_store() + static_cast<size_t>(i * l.hd) * 2; }
  uint8_t* value_f16(int64_t i) const { return value_store() + l.value_store() + static_cast<size_t>(i * l.hd) * 2; }
  uint8_t* key_block(int64_t slot) const { return key_store() + (slot / G - l.first()) * l.key_block(); }
  uint8_t* value_row(int64_t slot) const { return value_store() + (slot - l.first() * G) * l.value_row(); }
  int64_t ring_index(int64_t p) const { return G + p % l.recent; }  // f16 vector index: the sink comes first
};

// Moves positions [s, s + G) from the f16 ring into the store (block 0 into the f16 sink).
void seal(const KvCache& c, const KiviLayout& l, int64_t s) {
  for (int64_t t = 0; t < G; ++t)
    if (c.slot_pos[(s + t) % c.capacity] != s + t)
      throw KernelError("kv_write: a kivi2 cache seals whole blocks of positions, and position " +
                        std::to_string(s + t) + " was never written");
  const int64_t hd = l.hd;
  std::vector<float> x(static_cast<size_t>(G * hd));
  for (int64_t h = 0; h < c.n_kv_heads; ++h) {
    const HeadView hv{c, l, h};
    if (s == 0) {
      for (int64_t t = 0; t < G; ++t) {
        std::memcpy(hv.key_f16(t), hv.key_f16(hv.ring_index(t)), static_cast<size_t>(hd) * 2);
        std::memcpy(hv.value_f16(t), hv.value_f16(hv.ring_index(t)), static_cast<size_t>(hd) * 2);
      }
      continue;
    }
    // Keys: the block's G vectors as [G, hd] floats, then per channel (stride hd) kSub groups of GK positions.
    for (int64_t t = 0; t < G; ++t) {
      const uint8_t* src = hv.key_f16(hv.ring_index(s + t));
      for (int64_t e = 0; e < hd; ++e) x[t * hd + e] = fp16_to_f32(load16(src + 2 * e));
    }
    uint8_t* kb = hv.key_block(s % c.capacity);
    for (int64_t e = 0; e < hd; ++e)
      for (int64_t sub = 0; sub < kSub; ++sub) {
        uint16_t d, m;
        quantize_group(x.data() + sub * GK * hd + e, hd, GK, &d, &m, kb + 4 * kSub * hd + e * (G / 4) + sub * (GK / 4));
        store16(kb + 2 * (e * kSub + sub), d);
        store16(kb + 2 * kSub * hd + 2 * (e * kSub + sub), m);
      }
    // Values: each position's vector in groups of G channels, in its own slot's row.
    for (int64_t t = 0; t < G; ++t) {
      const uint8_t* src = hv.value_f16(hv.ring_index(s + t));
      uint8_t* row = hv.value_row((s + t) % c.capacity);
      for (int64_t e = 0; e < hd; ++e) x[e] = fp16_to_f32(load16(src + 2 * e));
      for (int64_t g = 0; g < hd / G; ++g) {
        uint8_t* grp = row + g * kValueGroupBytes;
        uint16_t d, m;
        quantize_group(x.data() + g * G, 1, G, &d, &m, grp + 4);
        store16(grp, d);
        store16(grp + 2, m);
      }
    }
  }
}

void check_shape(int64_t capacity, int64_t head_dim) {
  if (head_dim <= 0 || head_dim % G || head_dim > kMaxHeadDim)
    throw KernelError("a kivi2 KV cache needs head_dim a positive multiple of " + std::to_string(G) + " up to " +
                      std::to_string(kMaxHeadDim) + ", got " + std::to_string(head_dim));
  if (capacity <= 0 || capacity % G)
    throw KernelError("a kivi2 KV cache needs a capacity that is a positive multiple of " + std::to_string(G) +
                      ", got " + std::to_string(capacity));
}

}  // namespace

// The ring holds every position not yet sealed: at most kKiviRecent + G - 1 before a run, plus the run.
int64_t kv_recent_slots(int64_t capacity) { return std::min(kKiviRecent + G + kKiviMaxWrite - 1, capacity); }

int64_t kv_capacity(Format fmt, int64_t slots) {
  if (fmt != Format::kivi2) return slots;
  return (slots + G - 1) / G * G;
}

size_t kv_key_bytes(Format fmt, int64_t n_kv_heads, int64_t capacity, int64_t head_dim, bool wraps) {
  if (fmt != Format::kivi2) return static_cast<size_t>(n_kv_heads * capacity) * kv_row_bytes(fmt, head_dim);
  check_shape(capacity, head_dim);
  return static_cast<size_t>(n_kv_heads) * layout(capacity, head_dim, wraps).key_head();
}

size_t kv_value_bytes(Format fmt, int64_t n_kv_heads, int64_t capacity, int64_t head_dim, bool wraps) {
  if (fmt != Format::kivi2) return kv_key_bytes(fmt, n_kv_heads, capacity, head_dim, wraps);
  check_shape(capacity, head_dim);
  return static_cast<size_t>(n_kv_heads) * layout(capacity, head_dim, wraps).value_head();
}

size_t kv_cache_bytes(Format fmt, int64_t n_kv_heads, int64_t capacity, int64_t head_dim, bool wraps) {
  return kv_key_bytes(fmt, n_kv_heads, capacity, head_dim, wraps) +
         kv_value_bytes(fmt, n_kv_heads, capacity, head_dim, wraps);
}

namespace kivi {

void check(const KvCache& c, const char* what) {
  if (!c.sealed) throw KernelError(std::string(what) + ": a kivi2 KV cache needs its sealed-position counter");
  if (*c.sealed < 0 || *c.sealed % G)
    throw KernelError(std::string(what) + ": a kivi2 cache's sealed position must be a multiple of " +
                      std::to_string(G) + ", got " + std::to_string(*c.sealed));
}

void write(const KvCache& c, const float* k, const float* v, int64_t n, const int32_t* slots, const int32_t* positions) {
  const KiviLayout l = layout(c.capacity, c.head_dim, c.wraps);
  const int64_t hd = l.hd;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t p = positions[i];
    if (slots[i] != p % c.capacity)
      throw KernelError("kv_write: a kivi2 cache keeps position " + std::to_string(p) + " in slot " +
                        std::to_string(p % c.capacity) + ", got slot " + std::to_string(slots[i]));
    if (p < *c.sealed)
      throw KernelError("kv_write: position " + std::to_string(p) + " is already in the 2-bit store (sealed up to " +
                        std::to_string(*c.sealed) + ")");
    if (p >= c.capacity && !c.wraps)
      throw KernelError("kv_write: position " + std::to_string(p) + " is past this kivi2 cache's " +
                        std::to_string(c.capacity) + " slots (made without a ring buffer)");
    if (p >= c.capacity && l.recent < kKiviRecent + G + kKiviMaxWrite - 1)
      throw KernelError("kv_write: a kivi2 ring buffer needs a capacity of at least " +
                        std::to_string(kKiviRecent + G + kKiviMaxWrite - 1) + " slots, got " +
                        std::to_string(c.capacity));
    // Blocks are sealed against the position before each run of kKiviMaxWrite written together, so
    // every query of a prefill batch sees at least the kKiviRecent - kKiviMaxWrite + 1 positions
    // before its run in f16 (a decoded token: kKiviRecent).
    if (i % kKiviMaxWrite == 0)
      while (*c.sealed + G - 1 + kKiviRecent <= p - 1) {
        seal(c, l, *c.sealed);
        *c.sealed += G;
      }
    for (int64_t h = 0; h < c.n_kv_heads; ++h) {
      const HeadView hv{c, l, h};
      uint8_t* kd = hv.key_f16(hv.ring_index(p));
      uint8_t* vd = hv.value_f16(hv.ring_index(p));
      const float* ks = k + (i * c.n_kv_heads + h) * hd;
      const float* vs = v + (i * c.n_kv_heads + h) * hd;
      for (int64_t e = 0; e < hd; ++e) store16(kd + 2 * e, f32_to_fp16(ks[e])), store16(vd + 2 * e, f32_to_fp16(vs[e]));
    }
    c.slot_pos[slots[i]] = static_cast<int32_t>(p);
  }
}

void rows_f16(const KvCache& c, int64_t g, int64_t j0, int64_t count, uint16_t* k, uint16_t* v) {
  const KiviLayout l = layout(c.capacity, c.head_dim, c.wraps);
  const HeadView hv{c, l, g};
  const int64_t hd = l.hd;
  float kd[kMaxHeadDim * kSub], km[kMaxHeadDim * kSub];  // one key block's scales and minimums
  int64_t block_read = -1;
  for (int64_t j = j0; j < j0 + count; ++j) {
    uint16_t* ko = k + (j - j0) * hd;
    uint16_t* vo = v + (j - j0) * hd;
    const int64_t p = c.slot_pos[j];
    if (p < 0) {
      std::fill(ko, ko + hd, uint16_t{0});
      std::fill(vo, vo + hd, uint16_t{0});
    } else if (p >= *c.sealed || p < G) {  // in the f16 ring, or the sink
      const int64_t i = p >= *c.sealed ? hv.ring_index(p) : p;
      std::memcpy(ko, hv.key_f16(i), static_cast<size_t>(hd) * 2);
      std::memcpy(vo, hv.value_f16(i), static_cast<size_t>(hd) * 2);
    } else {
      const int64_t block = j / G, t = j % G, sub = t / GK;
      const uint8_t* kb = hv.key_block(j);
      if (block != block_read) {
        for (int64_t e = 0; e < hd * kSub; ++e)
          kd[e] = fp16_to_f32(load16(kb + 2 * e)), km[e] = fp16_to_f32(load16(kb + 2 * kSub * hd + 2 * e));
        block_read = block;
      }
      const uint8_t* codes = kb + 4 * kSub * hd;
      for (int64_t e = 0; e < hd; ++e)
        ko[e] = f32_to_fp16(km[e * kSub + sub] + kd[e * kSub + sub] * static_cast<float>(code_at(codes + e * (G / 4), t)));
      const uint8_t* row = hv.value_row(j);
      for (int64_t gi = 0; gi < hd / G; ++gi) {
        const uint8_t* grp = row + gi * kValueGroupBytes;
        const float d = fp16_to_f32(load16(grp)), m = fp16_to_f32(load16(grp + 2));
        for (int64_t i = 0; i < G; ++i)
          vo[gi * G + i] = f32_to_fp16(m + d * static_cast<float>(code_at(grp + 4, i)));
      }
    }
  }
}

}  // namespace kivi
}  // namespace ef
