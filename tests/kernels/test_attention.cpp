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

// kivi2: written in prefill batches and single tokens past the capacity (a ring), read back by
// kv_read; attention at this level against the reference level and against the exact math over
// the values kv_read returns (what every level's chunk kernel sees).
void test_attention_kivi2() {
  const Case cases[] = {
      {1, 4, 256, 320, 3, 0, false, 0.0f},    // Gemma-like head_dim, no wrap
      {2, 6, 64, 192, 4, 150, false, 0.0f},   // GQA, a sliding window over a ring
      {3, 9, 128, 256, 5, 0, false, 30.0f},   // softcap
  };
  for (const Case& c : cases) {
    const bool wraps = c.window > 0;
    std::vector<uint8_t> K(ef::kv_key_bytes(ef::Format::kivi2, c.n_kv, c.cap, c.hd, wraps));
    std::vector<uint8_t> V(ef::kv_value_bytes(ef::Format::kivi2, c.n_kv, c.cap, c.hd, wraps));
    std::vector<int32_t> slot_pos(c.cap, -1);
    int64_t sealed = 0;
    ef::KvCache cache{K.data(), V.data(), K.size(), ef::Format::kivi2, c.n_kv, c.cap, c.hd, slot_pos.data(), &sealed,
                      V.size(), wraps};
    cache.rope.rot_dim = c.hd == 256 ? 128 : c.hd;  // keys stored unrotated; partial RoPE on the first case
    cache.rope.theta_base = 10000.0f;
    const int64_t n_pos = wraps ? c.cap + c.cap / 2 : c.cap - 7;
    for (int64_t p0 = 0; p0 < n_pos;) {
      const int64_t n = std::min<int64_t>(p0 < c.cap / 2 ? 64 : 1, n_pos - p0);  // prefill, then decode
      std::vector<int32_t> slots(n), pos(n);
      for (int64_t i = 0; i < n; ++i) pos[i] = static_cast<int32_t>(p0 + i), slots[i] = static_cast<int32_t>((p0 + i) % c.cap);
      const auto k = randn(n * c.n_kv * c.hd), v = randn(n * c.n_kv * c.hd);
      ef::kv_write(cache, k.data(), v.data(), n, slots.data(), pos.data());
      p0 += n;
    }
    expect(sealed > ef::kKiviGroup, "kivi2: the test reaches the 2-bit store");
    std::vector<int32_t> q_pos(c.n_q);
    for (int64_t i = 0; i < c.n_q; ++i) q_pos[i] = static_cast<int32_t>(n_pos - c.n_q + i);
    const auto q = randn(c.n_q * c.n_heads * c.hd);
    const float scale = 1.0f / std::sqrt(static_cast<float>(c.hd));
    ef::AttentionArgs args;
    args.q = q.data(), args.n_q = c.n_q, args.n_heads = c.n_heads, args.q_pos = q_pos.data();
    args.window = c.window, args.scale = scale, args.softcap = c.softcap;
    auto run = [&] { return attend(cache, args, c.n_q * c.n_heads * c.hd); };
    const auto want = under("ref", run);
    const auto got = run();
    std::vector<float> Kf(c.n_kv * c.cap * c.hd), Vf(Kf.size());
    ef::kv_read(cache, Kf.data(), Vf.data());
    const std::vector<uint8_t> no_mask(c.n_q * c.cap, 1);
    const auto exact = naive(c, q, Kf, Vf, slot_pos, q_pos, no_mask, scale);
    const std::string tag = "kivi2 n_kv=" + std::to_string(c.n_kv) + " hd=" + std::to_string(c.hd) +
                            " cap=" + std::to_string(c.cap) + " window=" + std::to_string(c.window);
    const auto e = rel_err(got, want, {1.0});
    expect(e.max_err <= 2e-5, "attention vs reference " + tag + ": " + std::to_string(e.max_err));
    const auto es = rel_err(want, exact, {1.0});
    expect(es.max_err <= 2e-5, "attention reference vs exact math " + tag + ": " + std::to_string(es.max_err));
  }
}

}  // namespace

void test_attention() {
  const Case cases[] = {
      {1, 4, 256, 300, 1, 0, false, 0.0f},   // Gemma-like decode: one KV head, long ring
      {1, 4, 256, 300, 4, 40, true, 0.0f},   // sliding window + tree mask
      {3, 9, 64, 100, 5, 0, true, 0.0f},     // SmolLM2-like GQA, verify 5 tokens
      {2, 2, 128, 65, 3, 17, false, 30.0f},  // no GQA, window edge, softcap
      {2, 4, 32, 1000, 2, 0, false, 0.0f},   // many slots: split over threads
  };
  for (ef::Format fmt : {ef::Format::f16, ef::Format::q8_0}) {
    for (const Case& c : cases) {
      const size_t rb = ef::kv_row_bytes(fmt, c.hd);
      std::vector<uint8_t> K(c.n_kv * c.cap * rb), V(K.size());
      std::vector<int32_t> slot_pos(c.cap, -1);
      const ef::KvCache cache{K.data(), V.data(), K.size(), fmt, c.n_kv, c.cap, c.hd, slot_pos.data()};
      // Ring buffer: position p goes to slot p % cap; write past the end so it wraps.
      const int64_t n_pos = c.cap + c.cap / 3;
      for (int64_t p0 = 0; p0 < n_pos; p0 += 7) {
        const int64_t n = std::min<int64_t>(7, n_pos - p0);
        std::vector<int32_t> slots(n), pos(n);
        for (int64_t i = 0; i < n; ++i) pos[i] = static_cast<int32_t>(p0 + i), slots[i] = static_cast<int32_t>((p0 + i) % c.cap);
        const auto k = randn(n * c.n_kv * c.hd), v = randn(n * c.n_kv * c.hd);
        ef::kv_write(cache, k.data(), v.data(), n, slots.data(), pos.data());
      }
      for (int64_t j = 3; j < c.cap; j += 11) slot_pos[j] = -1;  // holes
      std::vector<int32_t> q_pos(c.n_q);
      for (int64_t i = 0; i < c.n_q; ++i) q_pos[i] = static_cast<int32_t>(n_pos - 1 - (c.n_q - 1 - i) * 2);
      if (c.n_q > 2) q_pos[1] = static_cast<int32_t>(n_pos - c.cap - 5);  // older than every cached key: sees nothing
      std::vector<uint8_t> mask(c.n_q * c.cap, 1);
      if (c.mask)
        for (size_t i = 0; i < mask.size(); ++i) mask[i] = (i * 7919 % 10) >= 3;
      const auto q = randn(c.n_q * c.n_heads * c.hd);
      const float scale = 1.0f / std::sqrt(static_cast<float>(c.hd));
      ef::AttentionArgs args;
      args.q = q.data(), args.n_q = c.n_q, args.n_heads = c.n_heads, args.q_pos = q_pos.data();
      args.window = c.window, args.mask = c.mask ? mask.data() : nullptr, args.scale = scale, args.softcap = c.softcap;
      auto run = [&] { return attend(cache, args, c.n_q * c.n_heads * c.hd); };
      const auto want = under("ref", run);
      const auto got = run();
      const auto Kf = ref_dequant(fmt, K, c.n_kv * c.cap, c.hd), Vf = ref_dequant(fmt, V, c.n_kv * c.cap, c.hd);
      const auto exact = naive(c, q, Kf, Vf, slot_pos, q_pos, mask, scale);
      const std::string tag = std::string(ef::format_info(fmt).name) + " n_kv=" + std::to_string(c.n_kv) + " heads=" +
                              std::to_string(c.n_heads) + " hd=" + std::to_string(c.hd) + " cap=" + std::to_string(c.cap) +
                              " n_q=" + std::to_string(c.n_q) + " window=" + std::to_string(c.window);
      const auto e = rel_err(got, want, {1.0});
      expect(e.max_err <= 2e-5, "attention vs reference " + tag + ": " + std::to_string(e.max_err));
      const auto es = rel_err(want, exact, {1.0});
      expect(es.max_err <= 2e-5, "attention reference vs exact math " + tag + ": " + std::to_string(es.max_err));
      if (c.n_q > 2) {
        bool zero = true;
        for (int64_t k = 0; k < c.n_heads * c.hd; ++k) zero &= got[c.n_heads * c.hd + k] == 0.0f;
        expect(zero, "attention: a query that sees no key must get zeros " + tag);
      }
    }
  }
  note_impl("attention_f16");
  note_impl("attention_q8_0");
  test_attention_kivi2();
}

}  // namespace eftest
