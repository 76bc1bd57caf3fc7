// KIVI's 2-bit KV cache: keys per channel (a key channel's outliers stay in their channel, so a
// scale per channel over a block of positions fits them), values per token, the newest positions
// in f16. Quantization is asymmetric round-to-nearest: 4 levels min + d * {0..3}, d = (max - min) / 3,
// with d and min rounded to f16 first and the codes fit to the rounded pair.
#include "kv_kivi.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

namespace ef {
namespace {

constexpr int64_t G = kKiviGroup;
constexpr size_t kGroupBytes = 4 + G / 4;  // f16 scale, f16 min, 2-bit codes
constexpr int64_t kMaxHeadDim = 512;       // a key block's scales are read onto the stack

uint16_t load16(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return h;
}
void store16(uint8_t* p, uint16_t h) { std::memcpy(p, &h, 2); }

// G values x[i * stride] -> scale, min, codes (value i at bits 2 * (i % 4) of codes[i / 4]).
void quantize_group(const float* x, int64_t stride, uint16_t* d_out, uint16_t* m_out, uint8_t* codes) {
  float lo = x[0], hi = x[0];
  for (int64_t i = 1; i < G; ++i) lo = std::min(lo, x[i * stride]), hi = std::max(hi, x[i * stride]);
  const uint16_t dh = f32_to_fp16((hi - lo) / 3.0f), mh = f32_to_fp16(lo);
  const float d = fp16_to_f32(dh), m = fp16_to_f32(mh);
  const float inv = d > 0.0f ? 1.0f / d : 0.0f;
  std::memset(codes, 0, G / 4);
  for (int64_t i = 0; i < G; ++i) {
    const float q = std::nearbyint((x[i * stride] - m) * inv);
    const int c = q <= 0.0f ? 0 : q >= 3.0f ? 3 : static_cast<int>(q);
    codes[i / 4] |= static_cast<uint8_t>(c << (2 * (i % 4)));
  }
  *d_out = dh, *m_out = mh;
}

int code_at(const uint8_t* codes, int64_t i) { return (codes[i / 4] >> (2 * (i % 4))) & 3; }

struct KiviLayout {
  int64_t hd, cap, recent;
  size_t store, head;  // bytes of one head's store; of one head's store and f16 ring
  size_t key_block() const { return static_cast<size_t>(hd) * kGroupBytes; }
  size_t value_row() const { return static_cast<size_t>(hd / G) * kGroupBytes; }
};

KiviLayout layout(const KvCache& c) {
  KiviLayout l{c.head_dim, c.capacity, kv_recent_slots(c.capacity), 0, 0};
  l.store = static_cast<size_t>(c.capacity / G) * l.key_block();
  l.head = l.store + static_cast<size_t>(l.recent * c.head_dim) * 2;
  return l;
}

// Moves positions [s, s + G) from the f16 ring into the store.
void seal(const KvCache& c, const KiviLayout& l, int64_t s) {
  for (int64_t t = 0; t < G; ++t)
    if (c.slot_pos[(s + t) % c.capacity] != s + t)
      throw KernelError("kv_write: a kivi2 cache seals whole blocks of positions, and position " +
                        std::to_string(s + t) + " was never written");
  const int64_t hd = l.hd, block = (s % c.capacity) / G;
  std::vector<float> x(static_cast<size_t>(G * hd));
  for (int64_t h = 0; h < c.n_kv_heads; ++h) {
    // Keys: the block's G vectors as [G, hd] floats, then one group per channel (stride hd).
    const uint8_t* ring = c.k + h * l.head + l.store;
    for (int64_t t = 0; t < G; ++t) {
      const uint8_t* src = ring + static_cast<size_t>(((s + t) % l.recent) * hd) * 2;
      for (int64_t e = 0; e < hd; ++e) x[t * hd + e] = fp16_to_f32(load16(src + 2 * e));
    }
    uint8_t* kb = c.k + h * l.head + block * l.key_block();
    for (int64_t e = 0; e < hd; ++e) {
      uint16_t d, m;
      quantize_group(x.data() + e, hd, &d, &m, kb + 4 * hd + e * (G / 4));
      store16(kb + 2 * e, d);
      store16(kb + 2 * hd + 2 * e, m);
    }
    // Values: each position's vector in groups of G channels, in its own slot's row.
    const uint8_t* vring = c.v + h * l.head + l.store;
    for (int64_t t = 0; t < G; ++t) {
      const uint8_t* src = vring + static_cast<size_t>(((s + t) % l.recent) * hd) * 2;
      uint8_t* row = c.v + h * l.head + ((s + t) % c.capacity) * l.value_row();
      for (int64_t e = 0; e < hd; ++e) x[e] = fp16_to_f32(load16(src + 2 * e));
      for (int64_t g = 0; g < hd / G; ++g) {
        uint8_t* grp = row + g * kGroupBytes;
        uint16_t d, m;
        quantize_group(x.data() + g * G, 1, &d, &m, grp + 4);
        store16(grp, d);
        store16(grp + 2, m);
      }
    }
  }
}

}  // namespace

int64_t kv_recent_slots(int64_t capacity) { return std::min(kKiviRecent + kKiviGroup, capacity); }

int64_t kv_capacity(Format fmt, int64_t slots) {
  if (fmt != Format::kivi2) return slots;
  return (slots + kKiviGroup - 1) / kKiviGroup * kKiviGroup;
}

size_t kv_cache_bytes(Format fmt, int64_t n_kv_heads, int64_t capacity, int64_t head_dim) {
  if (fmt != Format::kivi2) return static_cast<size_t>(n_kv_heads * capacity) * kv_row_bytes(fmt, head_dim);
  if (head_dim <= 0 || head_dim % kKiviGroup || head_dim > kMaxHeadDim)
    throw KernelError("a kivi2 KV cache needs head_dim a positive multiple of " + std::to_string(kKiviGroup) +
                      " up to " + std::to_string(kMaxHeadDim) + ", got " + std::to_string(head_dim));
  if (capacity <= 0 || capacity % kKiviGroup)
    throw KernelError("a kivi2 KV cache needs a capacity that is a positive multiple of " +
                      std::to_string(kKiviGroup) + ", got " + std::to_string(capacity));
  KvCache c;
  c.capacity = capacity, c.head_dim = head_dim;
  return static_cast<size_t>(n_kv_heads) * layout(c).head;
}

namespace kivi {

void check(const KvCache& c, const char* what) {
  if (!c.sealed) throw KernelError(std::string(what) + ": a kivi2 KV cache needs its sealed-position counter");
  if (*c.sealed < 0 || *c.sealed % G)
    throw KernelError(std::string(what) + ": a kivi2 cache's sealed position must be a multiple of " +
                      std::to_string(G) + ", got " + std::to_string(*c.sealed));
}

void write(const KvCache& c, const float* k, const float* v, int64_t n, const int32_t* slots, const int32_t* positions) {
  const KiviLayout l = layout(c);
  const int64_t hd = l.hd;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t p = positions[i];
    if (slots[i] != p % c.capacity)
      throw KernelError("kv_write: a kivi2 cache keeps position " + std::to_string(p) + " in slot " +
                        std::to_string(p % c.capacity) + ", got slot " + std::to_string(slots[i]));
    if (p < *c.sealed)
      throw KernelError("kv_write: position " + std::to_string(p) + " is already in the 2-bit store (sealed up to " +
                        std::to_string(*c.sealed) + ")");
    if (p >= c.capacity && l.recent < kKiviRecent + G)
      throw KernelError("kv_write: a kivi2 ring buffer needs a capacity of at least " +
                        std::to_string(kKiviRecent + G) + " slots, got " + std::to_string(c.capacity));
    while (*c.sealed + G - 1 + kKiviRecent <= p) {
      seal(c, l, *c.sealed);
      *c.sealed += G;
    }
    const size_t at = static_cast<size_t>((p % l.recent) * hd) * 2;
    for (int64_t h = 0; h < c.n_kv_heads; ++h) {
      uint8_t* kd = c.k + h * l.head + l.store + at;
      uint8_t* vd = c.v + h * l.head + l.store + at;
      const float* ks = k + (i * c.n_kv_heads + h) * hd;
      const float* vs = v + (i * c.n_kv_heads + h) * hd;
      for (int64_t e = 0; e < hd; ++e) store16(kd + 2 * e, f32_to_fp16(ks[e])), store16(vd + 2 * e, f32_to_fp16(vs[e]));
    }
    c.slot_pos[slots[i]] = static_cast<int32_t>(p);
  }
}

void rows_f16(const KvCache& c, int64_t g, int64_t j0, int64_t count, uint16_t* k, uint16_t* v) {
  const KiviLayout l = layout(c);
  const int64_t hd = l.hd;
  const uint8_t* kh = c.k + g * l.head;
  const uint8_t* vh = c.v + g * l.head;
  float kd[kMaxHeadDim], km[kMaxHeadDim];  // one key block's scales and minimums
  int64_t block_read = -1;
  for (int64_t j = j0; j < j0 + count; ++j) {
    uint16_t* ko = k + (j - j0) * hd;
    uint16_t* vo = v + (j - j0) * hd;
    const int64_t p = c.slot_pos[j];
    if (p < 0) {
      std::fill(ko, ko + hd, uint16_t{0});
      std::fill(vo, vo + hd, uint16_t{0});
    } else if (p >= *c.sealed) {  // in the f16 ring
      const size_t at = l.store + static_cast<size_t>((p % l.recent) * hd) * 2;
      std::memcpy(ko, kh + at, static_cast<size_t>(hd) * 2);
      std::memcpy(vo, vh + at, static_cast<size_t>(hd) * 2);
    } else {
      const int64_t block = j / G, t = j % G;
      const uint8_t* kb = kh + block * l.key_block();
      if (block != block_read) {
        for (int64_t e = 0; e < hd; ++e) kd[e] = fp16_to_f32(load16(kb + 2 * e)), km[e] = fp16_to_f32(load16(kb + 2 * hd + 2 * e));
        block_read = block;
      }
      const uint8_t* codes = kb + 4 * hd;
      for (int64_t e = 0; e < hd; ++e)
        ko[e] = f32_to_fp16(km[e] + kd[e] * static_cast<float>(code_at(codes + e * (G / 4), t)));
      const uint8_t* row = vh + j * l.value_row();
      for (int64_t gi = 0; gi < hd / G; ++gi) {
        const uint8_t* grp = row + gi * kGroupBytes;
        const float d = fp16_to_f32(load16(grp)), m = fp16_to_f32(load16(grp + 2));
        for (int64_t i = 0; i < G; ++i)
          vo[gi * G + i] = f32_to_fp16(m + d * static_cast<float>(code_at(grp + 4, i)));
      }
    }
  }
}

}  // namespace kivi
}  // namespace ef
