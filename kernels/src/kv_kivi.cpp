// KIVI's 2-bit KV cache: keys per channel (a key channel's outliers stay in their channel, so a
// scale per channel over a few positions fits them), values per token, the newest positions in
// q8_0 rows (near f16's quality at about half its bytes), and in a cache that does not wrap the
// first block of positions (the attention sink most heads put much of their weight on) in q8_0
// too; a wrapping cache serves a sliding window, which leaves the first positions behind. Values: asymmetric round-to-nearest to 4 levels min + d * {0..3},
// d = (max - min) / 3, with d and min rounded to f16 first and the codes fit to the rounded pair.
// Keys: see quantize_key_channel and allocate_key_bits.
#include "kv_kivi.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <cstring>
#include <string>
#include <vector>

#include "kernel_table.h"
#include "rope_freq.h"

namespace ef {
namespace {

constexpr int64_t G = kKiviGroup;       // positions per block; channels per value group
static_assert(kKiviKeyGroup == kKiviGroup, "a key block is one Hadamard transform over its positions");
constexpr float kInvSqrtG = 0.17677669529663687f;  // 1 / sqrt(G): the transform is orthonormal
constexpr size_t kValueGroupBytes = 4 + G / 4;  // f16 scale, f16 min, 2-bit codes
constexpr int64_t kMaxHeadDim = 512;    // a key block's scales are read onto the stack
constexpr int kKeyBits = static_cast<int>(kKiviKeyBits), kKeyBitsMax = static_cast<int>(kKiviKeyBitsMax);
static_assert(G == 32, "a key channel's codes are bit planes of one 32-bit word each");

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

// In place, the orthonormal Walsh-Hadamard transform of G values x[t * stride] (its own inverse).
void hadamard(float* x, int64_t stride) {
  for (int64_t len = 1; len < G; len *= 2)
    for (int64_t i = 0; i < G; i += 2 * len)
      for (int64_t j = i; j < i + len; ++j) {
        const float a = x[j * stride], b = x[(j + len) * stride];
        x[j * stride] = a + b, x[(j + len) * stride] = a - b;
      }
  for (int64_t t = 0; t < G; ++t) x[t * stride] *= kInvSqrtG;
}

// The middle of the 2^bits levels: level c is (c - key_offset(bits)) * step.
float key_offset(int bits) { return 0.5f * static_cast<float>((1 << bits) - 1); }

// The nearest of the levels (code - key_offset(bits)) * step to y, given 1 / step.
int key_code(float y, float inv_step, int bits) {
  const int top = (1 << bits) - 1;
  const float q = std::floor(y * inv_step) + static_cast<float>((top + 1) / 2);
  return q <= 0.0f ? 0 : q >= static_cast<float>(top) ? top : static_cast<int>(q);
}

// Candidate steps per bit count, as multiples of the RMS around the MSE-best uniform step for a
// Gaussian (1.60, 1.00, 0.59 and 0.34 RMS for 1 to 4 bits); 0 bits keep the mean only.
constexpr int kMults = 7;
constexpr float kStepMults[kKeyBitsMax + 1][kMults] = {
    {1.0f, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f},
    {1.2f, 1.4f, 1.5f, 1.6f, 1.7f, 1.8f, 2.0f},
    {0.75f, 0.875f, 1.0f, 1.125f, 1.25f, 1.5f, 1.75f},
    {0.45f, 0.5f, 0.55f, 0.6f, 0.65f, 0.7f, 0.8f},
    {0.26f, 0.3f, 0.32f, 0.34f, 0.36f, 0.4f, 0.46f},
};

// A key channel over a block's G positions: its mean in f16, and the Hadamard transform of what
// is left quantized symmetrically to 2^bits levels (code - key_offset(bits)) * step, the step
// the multiple of its RMS with the least squared error. The transform spreads a token whose key
// stands out in this channel over all G coefficients, where a per-channel min / max range would
// have to stretch to it. codes: `bits` 32-bit words, word i holding bit i of each position's code.
void quantize_key_channel(float* x, int64_t stride, int bits, uint16_t* step_out, uint16_t* mean_out,
                          uint8_t* codes) {
  float sum = 0.0f;
  for (int64_t t = 0; t < G; ++t) sum += x[t * stride];
  const uint16_t mh = f32_to_fp16(sum / static_cast<float>(G));
  const float m = fp16_to_f32(mh);
  for (int64_t t = 0; t < G; ++t) x[t * stride] -= m;
  hadamard(x, stride);
  float ss = 0.0f;
  for (int64_t t = 0; t < G; ++t) ss += x[t * stride] * x[t * stride];
  const float rms = std::sqrt(ss / static_cast<float>(G));
  uint16_t dh = f32_to_fp16(bits ? rms : 0.0f);
  const float off = key_offset(bits);
  float best = std::numeric_limits<float>::infinity();
  for (int i = 0; bits && i < kMults; ++i) {  // the step of least squared error among these multiples
    const uint16_t th = f32_to_fp16(kStepMults[bits][i] * rms);
    const float td = fp16_to_f32(th), tinv = td > 0.0f ? 1.0f / td : 0.0f;
    float err = 0.0f;
    for (int64_t t = 0; t < G; ++t) {
      const float r = x[t * stride] - (static_cast<float>(key_code(x[t * stride], tinv, bits)) - off) * td;
      err += r * r;
    }
    if (err < best) best = err, dh = th;
  }
  const float d = fp16_to_f32(dh), inv = d > 0.0f ? 1.0f / d : 0.0f;
  uint32_t planes[kKeyBitsMax] = {};
  for (int64_t t = 0; t < G; ++t) {
    const int c = key_code(x[t * stride], inv, bits);
    for (int i = 0; i < bits; ++i) planes[i] |= static_cast<uint32_t>((c >> i) & 1) << t;
  }
  std::memcpy(codes, planes, static_cast<size_t>(bits) * 4);
  *step_out = dh, *mean_out = mh;
}

// Bits per key channel of one KV head, kKiviKeyBits on average and 0..kKiviKeyBitsMax each, from
// a block of its unrotated keys x [G, hd]: one bit at a time to the channel where it cuts
// w * kError[b] most, kError[b] a Gaussian's squared error under the best uniform step of b bits
// relative to its variance, w the channel's mean square over the block. A query weighs each key
// channel's error by its own entry there, and queries are large in the channels where keys are
// (Qwen2.5's biased channels, RoPE's slow pairs): weighed by the mean square rather than the
// variance, Qwen2.5-Coder-0.5B's perplexity rose 2.4% over f16's instead of 3.7%. A key channel's
// scale belongs to the layer and head (weights, norm), so one block sets it for the cache's life.
// Position 0 (the attention sink of most heads, its key unlike the others) is left out.
void allocate_key_bits(const float* x, int64_t hd, int64_t t0, uint8_t* bits) {
  static constexpr float kError[kKeyBitsMax + 1] = {1.0f, 0.3634f, 0.1175f, 0.03744f, 0.01154f};
  float w[kMaxHeadDim];
  for (int64_t e = 0; e < hd; ++e) {
    double sq = 0.0;
    for (int64_t t = t0; t < G; ++t) sq += static_cast<double>(x[t * hd + e]) * x[t * hd + e];
    w[e] = static_cast<float>(sq / static_cast<double>(G - t0));
    bits[e] = 0;
  }
  for (int64_t k = 0; k < kKeyBits * hd; ++k) {
    int64_t best = 0;
    float cut = -1.0f;
    for (int64_t e = 0; e < hd; ++e) {
      if (bits[e] >= kKeyBitsMax) continue;
      const float g = w[e] * (kError[bits[e]] - kError[bits[e] + 1]);
      if (g > cut) cut = g, best = e;
    }
    ++bits[best];
  }
}

// The inverse of quantize_key_channel for all hd channels of a key block at once, into out [G, hd]
// (codes to levels, the transform, the mean back), in loops over contiguous channels that the
// compiler vectorizes.
void dequantize_key_block(const uint8_t* kb, const uint8_t* bits, int64_t hd, float* out) {
  static_assert(kKeyBitsMax == 4, "a code is read from four planes");
  // Each channel's planes spread to four [hd] rows (zero past its bits), so that a position's codes
  // come from shifts by the same t across contiguous channels, a loop the compiler vectorizes.
  uint32_t planes[kKeyBitsMax][kMaxHeadDim];
  float d[kMaxHeadDim], off[kMaxHeadDim];
  const uint8_t* codes = kb + 4 * hd;
  for (int64_t e = 0; e < hd; ++e) {
    const int b = bits[e];
    d[e] = fp16_to_f32(load16(kb + 2 * e)), off[e] = key_offset(b);
    for (int i = 0; i < kKeyBitsMax; ++i) {
      planes[i][e] = 0;
      if (i < b) std::memcpy(&planes[i][e], codes, 4), codes += 4;
    }
  }
  for (int64_t t = 0; t < G; ++t) {
    float* row = out + t * hd;
    for (int64_t e = 0; e < hd; ++e) {
      const uint32_t c = ((planes[0][e] >> t) & 1u) | (((planes[1][e] >> t) & 1u) << 1) |
                         (((planes[2][e] >> t) & 1u) << 2) | (((planes[3][e] >> t) & 1u) << 3);
      row[e] = (static_cast<float>(static_cast<int32_t>(c)) - off[e]) * d[e];
    }
  }
  for (int64_t len = 1; len < G; len *= 2)
    for (int64_t i = 0; i < G; i += 2 * len)
      for (int64_t j = i; j < i + len; ++j) {
        float* a = out + j * hd;
        float* b = out + (j + len) * hd;
        for (int64_t e = 0; e < hd; ++e) {
          const float x = a[e], y = b[e];
          a[e] = x + y, b[e] = x - y;
        }
      }
  float m[kMaxHeadDim];
  for (int64_t e = 0; e < hd; ++e) m[e] = fp16_to_f32(load16(kb + 2 * hd + 2 * e));
  for (int64_t t = 0; t < G; ++t) {
    float* row = out + t * hd;
    for (int64_t e = 0; e < hd; ++e) row[e] *= kInvSqrtG;
    for (int64_t e = 0; e < hd; ++e) row[e] += m[e];
  }
}

// Keys are quantized before RoPE (KVQuant's finding): unrotated, a key channel keeps its range
// from one position to the next, where RoPE turns a high-frequency channel pair through a whole
// turn in a few positions and widens every per-channel range. A seal unrotates the ring's f16
// keys; a read rotates the dequantized keys back, the angle of position s + t (s a block's first
// position) composed in float from s's cos / sin and a table of the offsets t < G.
struct RopeTable : RopeFrequencies {
  std::vector<float> cos_t, sin_t;  // [G][half]
  std::vector<float> cos_b, sin_b;  // [blocks][half]: block starts 0, G, 2G, ..., filled as reads need them
  int64_t half() const { return rot_dim / 2; }
  void block_start(int64_t s, const float** c, const float** sn) {  // cos and sin of s (a multiple of G)
    const size_t b = static_cast<size_t>(s / G), h = static_cast<size_t>(half());
    if (cos_b.size() < (b + 1) * h) {
      const size_t from = cos_b.size() / h, to = std::max(b + 1, 2 * from);
      cos_b.resize(to * h), sin_b.resize(to * h);
      for (size_t i = from; i < to; ++i) at(static_cast<int64_t>(i) * G, cos_b.data() + i * h, sin_b.data() + i * h);
    }
    *c = cos_b.data() + b * h, *sn = sin_b.data() + b * h;
  }
  void at(int64_t pos, float* c, float* s) const {  // cos and sin of pos * inv_freq, [half] each
    for (int64_t i = 0; i < half(); ++i) {
      const double a = static_cast<double>(pos) * inv_freq[i];
      c[i] = static_cast<float>(std::cos(a)), s[i] = static_cast<float>(std::sin(a));
    }
  }
};

// A table per set of RoPE parameters (a model's layers may use two: Gemma 3's sliding and global).
RopeTable& rope_table(const RopeParams& p) {
  thread_local std::vector<RopeTable> tables;
  const int64_t half = p.rot_dim / 2;
  for (RopeTable& t : tables)
    if (t.made_from(p)) return t;
  if (tables.size() >= 4) tables.erase(tables.begin());
  RopeTable& t = tables.emplace_back();
  t.make(p);
  t.cos_t.resize(static_cast<size_t>(G * half)), t.sin_t.resize(t.cos_t.size());
  for (int64_t o = 0; o < G; ++o) t.at(o, t.cos_t.data() + o * half, t.sin_t.data() + o * half);
  return t;
}

void check_rope(const RopeParams& p, int64_t head_dim) {
  if (p.rot_dim == 0) return;
  if (p.rot_dim < 0 || p.rot_dim % 2 || p.rot_dim > head_dim || !(p.theta_base > 0.0f) || !(p.linear_scale > 0.0f))
    throw KernelError("a kivi2 cache's RoPE needs an even rot_dim in (0, head_dim=" + std::to_string(head_dim) +
                      "] and a positive theta and scale, got rot_dim " + std::to_string(p.rot_dim));
}

// One KV head's part of K: [key bits][key store][sink][ring]; of V: [value store][sink][ring]. Sink
// and ring are q8_0 rows (GGML's: per 32 values an f16 scale and 32 int8 codes). Key bits: a byte
// per channel, set when the head's first block enters the store.
// A key block (G positions): f16 step [hd], f16 mean [hd], then each channel's bits[e] 32-bit
// code words (kKiviKeyBits * hd words in all).
// A cache that never wraps has no store for block 0 (its positions stay in the sink).
struct KiviLayout {
  int64_t hd, cap, recent;  // recent: ring rows
  bool wraps;
  int64_t first() const { return wraps ? 0 : 1; }  // slot block of the store's first block
  size_t key_bits() const { return static_cast<size_t>(hd); }
  size_t key_block() const { return static_cast<size_t>(hd) * (4 + kKeyBits * G / 8); }
  size_t value_row() const { return static_cast<size_t>(hd / G) * kValueGroupBytes; }
  size_t key_store() const { return static_cast<size_t>(cap / G - first()) * key_block(); }
  size_t value_store() const { return static_cast<size_t>(cap - first() * G) * value_row(); }
  int64_t sink() const { return wraps ? 0 : G; }  // sink rows
  size_t ring_row() const { return kv_row_bytes(Format::q8_0, hd); }
  size_t ring_part() const { return static_cast<size_t>(sink() + recent) * ring_row(); }  // sink and ring
  size_t key_head() const { return key_bits() + key_store() + ring_part(); }
  size_t value_head() const { return value_store() + ring_part(); }
};

KiviLayout layout(int64_t capacity, int64_t head_dim, bool wraps) {
  return {head_dim, capacity, kv_recent_slots(capacity), wraps};
}

struct HeadView {  // one KV head: where its keys' and values' parts start
  const KvCache& c;
  const KiviLayout& l;
  int64_t h;
  uint8_t* key_bits() const { return c.k + h * l.key_head(); }
  uint8_t* key_store() const { return key_bits() + l.key_bits(); }
  uint8_t* value_store() const { return c.v + h * l.value_head(); }
  uint8_t* key_q8(int64_t i) const { return key_store() + l.key_store() + static_cast<size_t>(i) * l.ring_row(); }
  uint8_t* value_q8(int64_t i) const { return value_store() + l.value_store() + static_cast<size_t>(i) * l.ring_row(); }
  uint8_t* key_block(int64_t slot) const { return key_store() + (slot / G - l.first()) * l.key_block(); }
  uint8_t* value_row(int64_t slot) const { return value_store() + (slot - l.first() * G) * l.value_row(); }
  int64_t ring_index(int64_t p) const { return l.sink() + p % l.recent; }  // q8_0 row index: the sink comes first
};

// A q8_0 row of hd values as floats (scale * code).
void q8_row(const uint8_t* row, int64_t hd, float* x) {
  for (int64_t b = 0; b < hd / 32; ++b) {
    const float d = fp16_to_f32(load16(row + 34 * b));
    for (int64_t i = 0; i < 32; ++i) x[32 * b + i] = d * static_cast<float>(static_cast<int8_t>(row[34 * b + 2 + i]));
  }
}

// Moves positions [s, s + G) from the ring into the store (block 0 of a cache that does not wrap
// into the sink).
void seal(const KvCache& c, const KiviLayout& l, int64_t s) {
  for (int64_t t = 0; t < G; ++t)
    if (c.slot_pos[(s + t) % c.capacity] != s + t)
      throw KernelError("kv_write: a kivi2 cache seals whole blocks of positions, and position " +
                        std::to_string(s + t) + " was never written");
  const int64_t hd = l.hd, half = c.rope.rot_dim / 2;
  std::vector<float> x(static_cast<size_t>(G * hd));
  std::vector<float> cs(static_cast<size_t>(G * half)), sn_all(cs.size());  // the block's positions' angles
  if (half && (s > 0 || !l.sink())) {
    const RopeTable& rt = rope_table(c.rope);
    for (int64_t t = 0; t < G; ++t) rt.at(s + t, cs.data() + t * half, sn_all.data() + t * half);
  }
  for (int64_t h = 0; h < c.n_kv_heads; ++h) {
    const HeadView hv{c, l, h};
    if (s == 0 && l.sink()) {
      for (int64_t t = 0; t < G; ++t) {
        std::memcpy(hv.key_q8(t), hv.key_q8(hv.ring_index(t)), l.ring_row());
        std::memcpy(hv.value_q8(t), hv.value_q8(hv.ring_index(t)), l.ring_row());
      }
      continue;
    }
    // Keys: the block's G vectors as [G, hd] floats, unrotated, then per channel (stride hd).
    for (int64_t t = 0; t < G; ++t) {
      float* xt = x.data() + t * hd;
      q8_row(hv.key_q8(hv.ring_index(s + t)), hd, xt);
      for (int64_t i = 0; i < half; ++i) {
        const float c = cs[t * half + i], sn = sn_all[t * half + i], x0 = xt[i], x1 = xt[i + half];
        xt[i] = x0 * c + x1 * sn;
        xt[i + half] = x1 * c - x0 * sn;
      }
    }
    uint8_t* kb = hv.key_block(s % c.capacity);
    uint8_t* bits = hv.key_bits();
    if (s == l.first() * G) allocate_key_bits(x.data(), hd, s == 0 ? 1 : 0, bits);
    uint8_t* codes = kb + 4 * hd;
    for (int64_t e = 0; e < hd; ++e) {
      uint16_t d, m;
      quantize_key_channel(x.data() + e, hd, bits[e], &d, &m, codes);
      codes += 4 * bits[e];
      store16(kb + 2 * e, d);
      store16(kb + 2 * hd + 2 * e, m);
    }
    // Values: each position's vector in groups of G channels, in its own slot's row.
    for (int64_t t = 0; t < G; ++t) {
      uint8_t* row = hv.value_row((s + t) % c.capacity);
      q8_row(hv.value_q8(hv.ring_index(s + t)), hd, x.data());
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

// An eighth of the capacity (whole blocks), from kKiviRecentMin to kKiviRecentMax positions.
int64_t kv_recent(int64_t capacity) {
  return std::clamp(capacity / 8 / G * G, kKiviRecentMin, kKiviRecentMax);
}

// The ring holds every position not yet sealed: at most kv_recent + G - 1 before a run, plus the run.
int64_t kv_recent_slots(int64_t capacity) { return std::min(kv_recent(capacity) + G + kKiviMaxWrite - 1, capacity); }

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
  check_rope(c.rope, c.head_dim);
  if (*c.sealed < 0 || *c.sealed % G)
    throw KernelError(std::string(what) + ": a kivi2 cache's sealed position must be a multiple of " +
                      std::to_string(G) + ", got " + std::to_string(*c.sealed));
}

void write(const KvCache& c, const float* k, const float* v, int64_t n, const int32_t* slots, const int32_t* positions) {
  const KiviLayout l = layout(c.capacity, c.head_dim, c.wraps);
  const int64_t hd = l.hd, recent = kv_recent(c.capacity);
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
    if (p >= c.capacity && l.recent < recent + G + kKiviMaxWrite - 1)
      throw KernelError("kv_write: a kivi2 ring buffer needs a capacity of at least " +
                        std::to_string(recent + G + kKiviMaxWrite - 1) + " slots, got " +
                        std::to_string(c.capacity));
    // Blocks are sealed against the position before each run of kKiviMaxWrite written together, so
    // every query of a prefill batch sees at least the recent - kKiviMaxWrite + 1 positions
    // before its run in q8_0 (a decoded token: recent).
    if (i % kKiviMaxWrite == 0)
      while (*c.sealed + G - 1 + recent <= p - 1) {
        seal(c, l, *c.sealed);
        *c.sealed += G;
      }
    for (int64_t h = 0; h < c.n_kv_heads; ++h) {
      const HeadView hv{c, l, h};
      quantize_rows(k + (i * c.n_kv_heads + h) * hd, 1, hd, Format::q8_0, hv.key_q8(hv.ring_index(p)), l.ring_row());
      quantize_rows(v + (i * c.n_kv_heads + h) * hd, 1, hd, Format::q8_0, hv.value_q8(hv.ring_index(p)), l.ring_row());
    }
    c.slot_pos[slots[i]] = static_cast<int32_t>(p);
  }
}

void rows_f16(const KvCache& c, int64_t g, int64_t j0, int64_t count, uint16_t* k, uint16_t* v) {
  const KiviLayout l = layout(c.capacity, c.head_dim, c.wraps);
  const HeadView hv{c, l, g};
  const int64_t hd = l.hd;
  thread_local std::vector<float> kblock;  // one key block, dequantized and still unrotated: [G, hd]
  kblock.resize(static_cast<size_t>(G * hd));
  float kf[kMaxHeadDim];  // a key or a value
  const ToHalfFn half_of = kernels().to_half.fn;  // the conversion dominated these reads when scalar
  const int64_t half = c.rope.rot_dim / 2;
  RopeTable* rt = half ? &rope_table(c.rope) : nullptr;
  const float *cb = nullptr, *sb = nullptr;  // the block's first position's angles
  int64_t block_read = -1;
  for (int64_t j = j0; j < j0 + count; ++j) {
    uint16_t* ko = k + (j - j0) * hd;
    uint16_t* vo = v + (j - j0) * hd;
    const int64_t p = c.slot_pos[j];
    if (p < 0) {
      std::fill(ko, ko + hd, uint16_t{0});
      std::fill(vo, vo + hd, uint16_t{0});
    } else if (p >= *c.sealed || p < l.sink()) {  // in the ring, or the sink
      const int64_t i = p >= *c.sealed ? hv.ring_index(p) : p;
      q8_row(hv.key_q8(i), hd, kf);
      half_of(kf, hd, ko);
      q8_row(hv.value_q8(i), hd, kf);
      half_of(kf, hd, vo);
    } else {
      const int64_t block = j / G, t = j % G;
      if (block != block_read) {
        const uint8_t* kb = hv.key_block(j);
        dequantize_key_block(kb, hv.key_bits(), hd, kblock.data());
        if (rt) rt->block_start(p - t, &cb, &sb);  // slot j holds position p, and p % G == j % G == t
        block_read = block;
      }
      std::copy(kblock.data() + t * hd, kblock.data() + (t + 1) * hd, kf);
      for (int64_t i = 0; i < half; ++i) {
        const float ct = rt->cos_t[t * half + i], st = rt->sin_t[t * half + i];
        const float cp = cb[i] * ct - sb[i] * st, sp = sb[i] * ct + cb[i] * st;
        const float x0 = kf[i], x1 = kf[i + half];
        kf[i] = x0 * cp - x1 * sp;
        kf[i + half] = x0 * sp + x1 * cp;
      }
      half_of(kf, hd, ko);
      const uint8_t* row = hv.value_row(j);
      for (int64_t gi = 0; gi < hd / G; ++gi) {
        const uint8_t* grp = row + gi * kValueGroupBytes;
        const float d = fp16_to_f32(load16(grp)), m = fp16_to_f32(load16(grp + 2));
        for (int64_t i = 0; i < G; ++i) kf[gi * G + i] = m + d * static_cast<float>(code_at(grp + 4, i));
      }
      half_of(kf, hd, vo);
    }
  }
}

}  // namespace kivi
}  // namespace ef
