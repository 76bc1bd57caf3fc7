// Attention over a slot-addressed KV cache (f16, q8_0 and kivi2): GQA, ring-buffer slots with holes,
// sliding-window edges, tree masks with holes, softcap, a query that sees nothing.
#include <algorithm>

#include "test_util.h"

namespace eftest {
namespace {

struct Case {
  int64_t n_kv, n_heads, hd, cap, n_q, window;
  bool mask;
  float softcap;
};

std::vector<float> naive(const Case& c, const std::vector<float>& q, const std::vector<float>& K, const std::vector<float>& V,
                         const std::vector<int32_t>& slot_pos, const std::vector<int32_t>& q_pos,
                         const std::vector<uint8_t>& mask, float scale) {
  std::vector<float> out(c.n_q * c.n_heads * c.hd, 0.0f);
  const int64_t group = c.n_heads / c.n_kv;
  for (int64_t i = 0; i < c.n_q; ++i)
    for (int64_t h = 0; h < c.n_heads; ++h) {
      const int64_t g = h / group;
      std::vector<double> s(c.cap, -INFINITY);
      double mx = -INFINITY;
      for (int64_t j = 0; j < c.cap; ++j) {
        const int64_t sp = slot_pos[j], qp = q_pos[i];
        const bool vis = sp >= 0 && sp <= qp && (c.window == 0 || qp - sp < c.window) && (!c.mask || mask[i * c.cap + j]);
        if (!vis) continue;
        double d = 0.0;
        for (int64_t e = 0; e < c.hd; ++e) d += static_cast<double>(q[(i * c.n_heads + h) * c.hd + e]) * K[(g * c.cap + j) * c.hd + e];
        d *= scale;
        if (c.softcap > 0) d = c.softcap * std::tanh(d / c.softcap);
        s[j] = d;
        mx = std::max(mx, d);
      }
      if (mx == -INFINITY) continue;
      double sum = 0.0;
      std::vector<double> o(c.hd, 0.0);
      for (int64_t j = 0; j < c.cap; ++j) {
        if (s[j] == -INFINITY) continue;
        const double p = std::exp(s[j] - mx);
        sum += p;
        for (int64_t e = 0; e < c.hd; ++e) o[e] += p * V[(g * c.cap + j) * c.hd + e];
      }
      for (int64_t e = 0; e < c.hd; ++e) out[(i * c.n_heads + h) * c.hd + e] = static_cast<float>(o[e] / sum);
    }
  return out;
}

// One attention call into a fresh output buffer, pre-filled with a value every element must overwrite.
std::vector<float> attend(const ef::KvCache& cache, ef::AttentionArgs args, size_t n) {
  std::vector<float> out(n, 123.0f);
  args.out = out.data();
  ef::attention(cache, args);
  return out;
}

// Keys and values for positions [p0, p0 + n), written into slots p % capacity by one kv_write.
struct Write {
  int64_t p0, n;
  std::vector<float> k, v;
};

// Writes every batch into a cache, as the case wrote them at the reference level.
void fill(const ef::KvCache& cache, const std::vector<Write>& writes) {
  for (const Write& w : writes) {
    std::vector<int32_t> slots(w.n), pos(w.n);
    for (int64_t i = 0; i < w.n; ++i)
      pos[i] = static_cast<int32_t>(w.p0 + i), slots[i] = static_cast<int32_t>((w.p0 + i) % cache.capacity);
    ef::kv_write(cache, w.k.data(), w.v.data(), w.n, slots.data(), pos.data());
  }
}

// A case with its inputs, the cache the reference level wrote from them, the reference twin's
// attention over that cache and exact math over the values the cache holds.
struct AttnCase {
  Case c{};
  ef::Format fmt = ef::Format::f16;
  std::vector<Write> writes;
  std::vector<uint8_t> K, V;
  std::vector<int32_t> slot_pos, q_pos;
  std::vector<uint8_t> mask;
  std::vector<float> q, Kf, Vf, want, exact;  // Kf, Vf: what kv_read returns (kivi2)
  int64_t sealed = 0;
  float scale = 1.0f;
  ef::AttentionArgs args() const {
    ef::AttentionArgs a;
    a.q = q.data(), a.n_q = c.n_q, a.n_heads = c.n_heads, a.q_pos = q_pos.data();
    a.window = c.window, a.mask = c.mask ? mask.data() : nullptr, a.scale = scale, a.softcap = c.softcap;
    return a;
  }
};

const Case kivi2_cases[] = {
    {1, 4, 256, 320, 3, 0, false, 0.0f},    // Gemma-like head_dim, no wrap
    {2, 6, 64, 192, 4, 150, false, 0.0f},   // GQA, a sliding window over a ring
    {3, 9, 128, 256, 5, 0, false, 30.0f},   // softcap
};

ef::KvCache kivi2_cache(const Case& c, std::vector<uint8_t>& K, std::vector<uint8_t>& V, std::vector<int32_t>& slot_pos,
                        int64_t* sealed) {
  const bool wraps = c.window > 0;
  K.assign(ef::kv_key_bytes(ef::Format::kivi2, c.n_kv, c.cap, c.hd, wraps), 0);
  V.assign(ef::kv_value_bytes(ef::Format::kivi2, c.n_kv, c.cap, c.hd, wraps), 0);
  slot_pos.assign(c.cap, -1);
  *sealed = 0;
  ef::KvCache cache{K.data(), V.data(), K.size(), ef::Format::kivi2, c.n_kv, c.cap, c.hd, slot_pos.data(), sealed,
                    V.size(), wraps};
  cache.rope.rot_dim = c.hd == 256 ? 128 : c.hd;  // keys stored unrotated; partial RoPE on the first case
  cache.rope.theta_base = 10000.0f;
  return cache;
}

std::string kivi2_tag(const Case& c) {
  return "kivi2 n_kv=" + std::to_string(c.n_kv) + " hd=" + std::to_string(c.hd) + " cap=" + std::to_string(c.cap) +
         " window=" + std::to_string(c.window);
}

const std::vector<AttnCase>& kivi2_attn_cases() {
  static const std::vector<AttnCase> cases = reference([] {
    std::vector<AttnCase> out;
    for (const Case& c : kivi2_cases) {
      AttnCase ac;
      ac.c = c, ac.fmt = ef::Format::kivi2;
      const ef::KvCache cache = kivi2_cache(c, ac.K, ac.V, ac.slot_pos, &ac.sealed);
      const int64_t n_pos = cache.wraps ? c.cap + c.cap / 2 : c.cap - 7;
      for (int64_t p0 = 0; p0 < n_pos;) {
        const int64_t n = std::min<int64_t>(p0 < c.cap / 2 ? 64 : 1, n_pos - p0);  // prefill, then decode
        Write w{p0, n, randn(n * c.n_kv * c.hd), {}};
        w.v = randn(n * c.n_kv * c.hd);
        ac.writes.push_back(std::move(w));
        p0 += n;
      }
      fill(cache, ac.writes);
      ac.q_pos.resize(c.n_q);
      for (int64_t i = 0; i < c.n_q; ++i) ac.q_pos[i] = static_cast<int32_t>(n_pos - c.n_q + i);
      ac.q = randn(c.n_q * c.n_heads * c.hd);
      ac.scale = 1.0f / std::sqrt(static_cast<float>(c.hd));
      ac.want = attend(cache, ac.args(), c.n_q * c.n_heads * c.hd);
      ac.Kf.resize(c.n_kv * c.cap * c.hd), ac.Vf.resize(ac.Kf.size());
      ef::kv_read(cache, ac.Kf.data(), ac.Vf.data());
      const std::vector<uint8_t> no_mask(c.n_q * c.cap, 1);
      ac.exact = naive(c, ac.q, ac.Kf, ac.Vf, ac.slot_pos, ac.q_pos, no_mask, ac.scale);
      const auto es = rel_err(ac.want, ac.exact, {1.0});
      expect(es.max_err <= 2e-5, "attention reference vs exact math " + kivi2_tag(c) + ": " + std::to_string(es.max_err));
      out.push_back(std::move(ac));
    }
    return out;
  });
  return cases;
}

// kivi2: written in prefill batches and single tokens past the capacity (a ring), read back by
// kv_read; attention at this level against the reference level, whose result was checked against
// the exact math over the values kv_read returns (what every level's chunk kernel sees). The
// cache this level writes and what it reads back are the reference level's to the bit.
void test_attention_kivi2() {
  for (const AttnCase& ac : kivi2_attn_cases()) {
    const Case& c = ac.c;
    std::vector<uint8_t> K, V;
    std::vector<int32_t> slot_pos;
    int64_t sealed = 0;
    const ef::KvCache cache = kivi2_cache(c, K, V, slot_pos, &sealed);
    fill(cache, ac.writes);
    const std::string tag = kivi2_tag(c);
    expect(sealed > ef::kKiviGroup, "kivi2: the test reaches the 2-bit store");
    expect(K == ac.K && V == ac.V && slot_pos == ac.slot_pos && sealed == ac.sealed,
           "kv_write " + tag + ": the cache differs from the one written at the reference level");
    std::vector<float> Kf(ac.Kf.size()), Vf(ac.Vf.size());
    ef::kv_read(cache, Kf.data(), Vf.data());
    expect(Kf == ac.Kf && Vf == ac.Vf, "kv_read " + tag + " differs from the reference level's");
    const auto got = attend(cache, ac.args(), c.n_q * c.n_heads * c.hd);
    const auto e = rel_err(got, ac.want, {1.0});
    expect(e.max_err <= 2e-5, "attention vs reference " + tag + ": " + std::to_string(e.max_err));
  }
}

const Case kCases[] = {
    {1, 4, 256, 300, 1, 0, false, 0.0f},   // Gemma-like decode: one KV head, long ring
    {1, 4, 256, 300, 4, 40, true, 0.0f},   // sliding window + tree mask
    {3, 9, 64, 100, 5, 0, true, 0.0f},     // SmolLM2-like GQA, verify 5 tokens
    {2, 2, 128, 65, 3, 17, false, 30.0f},  // no GQA, window edge, softcap
    {2, 4, 32, 1000, 2, 0, false, 0.0f},   // many slots: split over threads
};

std::string attn_tag(const Case& c, ef::Format fmt) {
  return std::string(ef::format_info(fmt).name) + " n_kv=" + std::to_string(c.n_kv) + " heads=" +
         std::to_string(c.n_heads) + " hd=" + std::to_string(c.hd) + " cap=" + std::to_string(c.cap) +
         " n_q=" + std::to_string(c.n_q) + " window=" + std::to_string(c.window);
}

// Ring buffer: position p goes to slot p % cap, written past the end so it wraps; then holes.
void fill_ring(const ef::KvCache& cache, const std::vector<Write>& writes, std::vector<int32_t>& slot_pos) {
  fill(cache, writes);
  for (int64_t j = 3; j < cache.capacity; j += 11) slot_pos[j] = -1;  // holes
}

const std::vector<AttnCase>& attn_cases() {
  static const std::vector<AttnCase> cases = reference([] {
    std::vector<AttnCase> out;
    for (ef::Format fmt : {ef::Format::f16, ef::Format::q8_0}) {
      for (const Case& c : kCases) {
        AttnCase ac;
        ac.c = c, ac.fmt = fmt;
        const size_t rb = ef::kv_row_bytes(fmt, c.hd);
        ac.K.assign(c.n_kv * c.cap * rb, 0), ac.V.assign(ac.K.size(), 0);
        ac.slot_pos.assign(c.cap, -1);
        const ef::KvCache cache{ac.K.data(), ac.V.data(), ac.K.size(), fmt, c.n_kv, c.cap, c.hd, ac.slot_pos.data()};
        const int64_t n_pos = c.cap + c.cap / 3;
        for (int64_t p0 = 0; p0 < n_pos; p0 += 7) {
          const int64_t n = std::min<int64_t>(7, n_pos - p0);
          Write w{p0, n, randn(n * c.n_kv * c.hd), {}};
          w.v = randn(n * c.n_kv * c.hd);
          ac.writes.push_back(std::move(w));
        }
        fill_ring(cache, ac.writes, ac.slot_pos);
        ac.q_pos.resize(c.n_q);
        for (int64_t i = 0; i < c.n_q; ++i) ac.q_pos[i] = static_cast<int32_t>(n_pos - 1 - (c.n_q - 1 - i) * 2);
        if (c.n_q > 2) ac.q_pos[1] = static_cast<int32_t>(n_pos - c.cap - 5);  // older than every cached key: sees nothing
        ac.mask.assign(c.n_q * c.cap, 1);
        if (c.mask)
          for (size_t i = 0; i < ac.mask.size(); ++i) ac.mask[i] = (i * 7919 % 10) >= 3;
        ac.q = randn(c.n_q * c.n_heads * c.hd);
        ac.scale = 1.0f / std::sqrt(static_cast<float>(c.hd));
        ac.want = attend(cache, ac.args(), c.n_q * c.n_heads * c.hd);
        const auto Kf = ref_dequant(fmt, ac.K, c.n_kv * c.cap, c.hd), Vf = ref_dequant(fmt, ac.V, c.n_kv * c.cap, c.hd);
        ac.exact = naive(c, ac.q, Kf, Vf, ac.slot_pos, ac.q_pos, ac.mask, ac.scale);
        const auto es = rel_err(ac.want, ac.exact, {1.0});
        expect(es.max_err <= 2e-5, "attention reference vs exact math " + attn_tag(c, fmt) + ": " + std::to_string(es.max_err));
        out.push_back(std::move(ac));
      }
    }
    return out;
  });
  return cases;
}

}  // namespace

// f16 and q8_0 caches: the cache this level writes is the reference level's to the bit, and
// attention over it matches the reference twin, whose result was checked against exact math.
void test_attention() {
  for (const AttnCase& ac : attn_cases()) {
    const Case& c = ac.c;
    std::vector<uint8_t> K(ac.K.size()), V(ac.V.size());
    std::vector<int32_t> slot_pos(c.cap, -1);
    const ef::KvCache cache{K.data(), V.data(), K.size(), ac.fmt, c.n_kv, c.cap, c.hd, slot_pos.data()};
    fill_ring(cache, ac.writes, slot_pos);
    const std::string tag = attn_tag(c, ac.fmt);
    expect(K == ac.K && V == ac.V && slot_pos == ac.slot_pos,
           "kv_write " + tag + ": the cache differs from the one written at the reference level");
    const auto got = attend(cache, ac.args(), c.n_q * c.n_heads * c.hd);
    const auto e = rel_err(got, ac.want, {1.0});
    expect(e.max_err <= 2e-5, "attention vs reference " + tag + ": " + std::to_string(e.max_err));
    if (c.n_q > 2) {
      bool zero = true;
      for (int64_t k = 0; k < c.n_heads * c.hd; ++k) zero &= got[c.n_heads * c.hd + k] == 0.0f;
      expect(zero, "attention: a query that sees no key must get zeros " + tag);
    }
  }
  note_impl("attention_f16");
  note_impl("attention_q8_0");
  test_attention_kivi2();
}

}  // namespace eftest
