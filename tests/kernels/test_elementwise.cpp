// RMSNorm, RoPE, gated activations, softmax, argmax and top-k against the reference and math.
#include <algorithm>

#include "test_util.h"

namespace eftest {

void test_elementwise() {
  for (int64_t d : {1, 7, 64, 640, 1001}) {
    const int64_t n = 3;
    const auto x = randn(n * d, 2.0f), w = randn(d);
    auto norm = [&] {
      std::vector<float> y(n * d);
      ef::rms_norm(x.data(), w.data(), y.data(), n, d, 1e-6f);
      return y;
    };
    const auto want = under("ref", norm), got = norm();
    double amax = 0;
    for (float v : want) amax = std::max(amax, static_cast<double>(std::fabs(v)));
    expect(rel_err(got, want, {amax}).max_err <= 1e-6, "rms_norm d=" + std::to_string(d));
    // in place
    std::vector<float> inplace = x;
    ef::rms_norm(inplace.data(), w.data(), inplace.data(), n, d, 1e-6f);
    expect(rel_err(inplace, got, {amax}).max_err == 0.0, "rms_norm in place differs");

    for (auto kind : {ef::Activation::silu, ef::Activation::gelu_tanh}) {
      const auto g = randn(n * d, 4.0f), u = randn(n * d);
      auto gate = [&] {
        std::vector<float> y(n * d);
        ef::gated_act(g.data(), u.data(), y.data(), n * d, kind);
        return y;
      };
      const auto gw = under("ref", gate), gg = gate();
      std::vector<double> sc(gw.size());
      for (size_t i = 0; i < sc.size(); ++i) sc[i] = std::fabs(g[i] * u[i]) + 1e-6;
      expect(rel_err(gg, gw, sc).max_err <= 3e-6, std::string("gated ") + (kind == ef::Activation::silu ? "silu" : "gelu") + " d=" + std::to_string(d));
    }

    auto sm = [&] {
      std::vector<float> y(n * d);
      ef::softmax(x.data(), y.data(), n, d);
      return y;
    };
    const auto sw = under("ref", sm), sg = sm();
    expect(rel_err(sg, sw, {1.0}).max_err <= 1e-6, "softmax d=" + std::to_string(d));
    double sum = 0;
    for (int64_t i = 0; i < d; ++i) sum += sg[i];
    expect(std::fabs(sum - 1.0) < 1e-5, "softmax row does not sum to 1");
  }
  note_impl("rms_norm");
  note_impl("gated_gelu_tanh");
  note_impl("softmax");

  // RoPE: against the rotate-half formula in double, with partial rotation and freq factors.
  for (int64_t rot : {64, 32, 6}) {
    const int64_t n = 4, heads = 3, hd = 64;
    std::vector<int32_t> pos = {0, 1, 517, 4095};
    std::vector<float> ff(rot / 2);
    for (int64_t i = 0; i < rot / 2; ++i) ff[i] = 1.0f + 0.25f * static_cast<float>(i % 4);
    ef::RopeParams p;
    p.rot_dim = rot, p.theta_base = 10000.0f, p.freq_factors = rot == 32 ? ff.data() : nullptr, p.linear_scale = rot == 6 ? 8.0f : 1.0f;
    const auto x = randn(n * heads * hd);
    auto run = [&] {
      std::vector<float> y = x;
      ef::rope(y.data(), n, heads, hd, pos.data(), p);
      return y;
    };
    const auto want = under("ref", run), got = run();
    expect(rel_err(got, want, {1.0}).max_err <= 1e-6, "rope vs reference rot_dim=" + std::to_string(rot));
    std::vector<float> exact = x;
    for (int64_t t = 0; t < n; ++t)
      for (int64_t h = 0; h < heads; ++h)
        for (int64_t i = 0; i < rot / 2; ++i) {
          double f = std::pow(10000.0, -2.0 * i / rot) / (p.freq_factors ? ff[i] : 1.0) / p.linear_scale;
          const double a = pos[t] * f;
          float* v = exact.data() + (t * heads + h) * hd;
          const double x0 = x[(t * heads + h) * hd + i], x1 = x[(t * heads + h) * hd + i + rot / 2];
          v[i] = static_cast<float>(x0 * std::cos(a) - x1 * std::sin(a));
          v[i + rot / 2] = static_cast<float>(x0 * std::sin(a) + x1 * std::cos(a));
        }
    expect(rel_err(got, exact, {1.0}).max_err <= 2e-6, "rope vs formula rot_dim=" + std::to_string(rot));
  }
  note_impl("rope");

  // argmax / top-k: exact, ties resolved to the lower index, vocab-sized rows.
  for (int64_t d : {5, 100, 262144}) {
    const int64_t n = d > 1000 ? 1 : 4;
    auto x = randn(n * d);
    for (auto& v : x) v = std::round(v * 4.0f) / 4.0f;  // many ties
    auto am = [&] {
      std::vector<int32_t> o(n);
      ef::argmax(x.data(), n, d, o.data());
      return o;
    };
    const auto aw = under("ref", am), ag = am();
    expect(aw == ag, "argmax d=" + std::to_string(d));
    for (int64_t t = 0; t < n; ++t) {
      const auto* row = x.data() + t * d;
      expect(ag[t] == std::max_element(row, row + d) - row, "argmax is not the first maximum");
    }
    for (int64_t k : {int64_t(1), std::min<int64_t>(d, 5), std::min<int64_t>(d, 40)}) {
      auto tk = [&] {
        std::pair<std::vector<float>, std::vector<int32_t>> r{std::vector<float>(n * k), std::vector<int32_t>(n * k)};
        ef::topk(x.data(), n, d, k, r.first.data(), r.second.data());
        return r;
      };
      const auto tw = under("ref", tk), tg = tk();
      expect(tw.second == tg.second && tw.first == tg.first, "topk d=" + std::to_string(d) + " k=" + std::to_string(k));
    }
  }
  // f32 -> f16: bit-identical to the scalar conversion over normal, subnormal, overflowing and
  // tie-rounding values, and lengths with and without a vector tail.
  {
    std::vector<float> x = randn(1037, 3.0f);
    const float special[] = {0.0f, -0.0f, 65504.0f, 65520.0f, 1e6f, -1e6f, 6.1e-5f, 3e-6f, -4e-8f, 1e-9f,
                             1.0f + 1.0f / 2048, 1.0f + 3.0f / 2048, 2049.0f, 2051.0f};
    for (size_t i = 0; i < sizeof(special) / sizeof(float); ++i) x[i * 37] = special[i];
    for (size_t i = 600; i < 700; ++i) x[i] *= 1e-5f;  // the subnormal range of half
    for (int64_t n : {int64_t(1), int64_t(7), int64_t(64), int64_t(1037)}) {
      std::vector<uint16_t> got(n), want(n);
      ef::to_half(x.data(), n, got.data());
      for (int64_t i = 0; i < n; ++i) want[i] = ef::f32_to_fp16(x[i]);
      expect(got == want, "to_half differs from f32_to_fp16, n=" + std::to_string(n));
    }
  }
  note_impl("to_half");
  note_impl("argmax");
  note_impl("topk");
}

}  // namespace eftest
