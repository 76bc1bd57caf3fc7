// RMSNorm, RoPE, gated activations, softmax, argmax and top-k against the reference and math.
#include <algorithm>

#include "test_util.h"

namespace eftest {

namespace {

constexpr int64_t kRows = 3;
const ef::Activation kKinds[] = {ef::Activation::silu, ef::Activation::gelu_tanh};

std::vector<float> norm(const std::vector<float>& x, const std::vector<float>& w, int64_t d) {
  std::vector<float> y(kRows * d);
  ef::rms_norm(x.data(), w.data(), y.data(), kRows, d, 1e-6f);
  return y;
}

std::vector<float> gate(const std::vector<float>& g, const std::vector<float>& u, ef::Activation kind) {
  std::vector<float> y(g.size());
  ef::gated_act(g.data(), u.data(), y.data(), static_cast<int64_t>(g.size()), kind);
  return y;
}

std::vector<float> soft(const std::vector<float>& x, int64_t d) {
  std::vector<float> y(kRows * d);
  ef::softmax(x.data(), y.data(), kRows, d);
  return y;
}

// Rows of d values and the reference twin's norm, gated activations and softmax of them.
struct RowCase {
  int64_t d;
  std::vector<float> x, w, want_norm, want_soft;
  std::vector<float> g[2], u[2], want_gate[2];  // per activation kind
};

const std::vector<RowCase>& row_cases() {
  static const std::vector<RowCase> cases = reference([] {
    std::vector<RowCase> out;
    for (int64_t d : {1, 7, 64, 640, 1001}) {
      RowCase c;
      c.d = d, c.x = randn(kRows * d, 2.0f), c.w = randn(d);
      c.want_norm = norm(c.x, c.w, d);
      for (int k = 0; k < 2; ++k) {
        c.g[k] = randn(kRows * d, 4.0f), c.u[k] = randn(kRows * d);
        c.want_gate[k] = gate(c.g[k], c.u[k], kKinds[k]);
      }
      c.want_soft = soft(c.x, d);
      out.push_back(std::move(c));
    }
    return out;
  });
  return cases;
}

// RoPE with partial rotation (rot_dim 32 with freq factors, 6 with a linear scale): the reference
// twin's rotation and the rotate-half formula in double.
struct RopeCase {
  int64_t rot;
  std::vector<float> ff, x, want, exact;
  ef::RopeParams params() const {
    ef::RopeParams p;
    p.rot_dim = rot, p.theta_base = 10000.0f, p.freq_factors = rot == 32 ? ff.data() : nullptr, p.linear_scale = rot == 6 ? 8.0f : 1.0f;
    return p;
  }
};
constexpr int64_t kRopeTokens = 4, kRopeHeads = 3, kRopeHeadDim = 64;
const std::vector<int32_t> kRopePos = {0, 1, 517, 4095};

std::vector<float> rotate(const RopeCase& c) {
  std::vector<float> y = c.x;
  const ef::RopeParams p = c.params();
  ef::rope(y.data(), kRopeTokens, kRopeHeads, kRopeHeadDim, kRopePos.data(), p);
  return y;
}

const std::vector<RopeCase>& rope_cases() {
  static const std::vector<RopeCase> cases = reference([] {
    std::vector<RopeCase> out;
    for (int64_t rot : {64, 32, 6}) {
      const int64_t n = kRopeTokens, heads = kRopeHeads, hd = kRopeHeadDim;
      const auto& pos = kRopePos;
      RopeCase c;
      c.rot = rot;
      c.ff.resize(rot / 2);
      for (int64_t i = 0; i < rot / 2; ++i) c.ff[i] = 1.0f + 0.25f * static_cast<float>(i % 4);
      const ef::RopeParams p = c.params();
      c.x = randn(n * heads * hd);
      c.want = rotate(c);
      const auto& x = c.x;
      std::vector<float>& exact = c.exact;
      exact = x;
      for (int64_t t = 0; t < n; ++t)
        for (int64_t h = 0; h < heads; ++h)
          for (int64_t i = 0; i < rot / 2; ++i) {
            double f = std::pow(10000.0, -2.0 * i / rot) / (p.freq_factors ? c.ff[i] : 1.0) / p.linear_scale;
            const double a = pos[t] * f;
            float* v = exact.data() + (t * heads + h) * hd;
            const double x0 = x[(t * heads + h) * hd + i], x1 = x[(t * heads + h) * hd + i + rot / 2];
            v[i] = static_cast<float>(x0 * std::cos(a) - x1 * std::sin(a));
            v[i + rot / 2] = static_cast<float>(x0 * std::sin(a) + x1 * std::cos(a));
          }
      out.push_back(std::move(c));
    }
    return out;
  });
  return cases;
}

std::vector<int32_t> arg(const std::vector<float>& x, int64_t n, int64_t d) {
  std::vector<int32_t> o(n);
  ef::argmax(x.data(), n, d, o.data());
  return o;
}

std::pair<std::vector<float>, std::vector<int32_t>> top(const std::vector<float>& x, int64_t n, int64_t d, int64_t k) {
  std::pair<std::vector<float>, std::vector<int32_t>> r{std::vector<float>(n * k), std::vector<int32_t>(n * k)};
  ef::topk(x.data(), n, d, k, r.first.data(), r.second.data());
  return r;
}

// Rows with many ties (up to vocab size) and the reference twin's argmax and top-k of them.
struct PickCase {
  int64_t d, n;
  std::vector<float> x;
  std::vector<int32_t> want_arg;
  std::vector<int64_t> ks;
  std::vector<std::pair<std::vector<float>, std::vector<int32_t>>> want_top;  // per k
};

const std::vector<PickCase>& pick_cases() {
  static const std::vector<PickCase> cases = reference([] {
    std::vector<PickCase> out;
    for (int64_t d : {5, 100, 262144}) {
      PickCase c;
      c.d = d, c.n = d > 1000 ? 1 : 4;
      c.x = randn(c.n * d);
      for (auto& v : c.x) v = std::round(v * 4.0f) / 4.0f;  // many ties
      c.want_arg = arg(c.x, c.n, d);
      c.ks = {int64_t(1), std::min<int64_t>(d, 5), std::min<int64_t>(d, 40)};
      for (int64_t k : c.ks) c.want_top.push_back(top(c.x, c.n, d, k));
      out.push_back(std::move(c));
    }
    return out;
  });
  return cases;
}

}  // namespace

void test_elementwise() {
  for (const RowCase& c : row_cases()) {
    const int64_t d = c.d, n = kRows;
    const auto& x = c.x;
    const auto& want = c.want_norm;
    const auto got = norm(x, c.w, d);
    double amax = 0;
    for (float v : want) amax = std::max(amax, static_cast<double>(std::fabs(v)));
    expect(rel_err(got, want, {amax}).max_err <= 1e-6, "rms_norm d=" + std::to_string(d));
    // in place
    std::vector<float> inplace = x;
    ef::rms_norm(inplace.data(), c.w.data(), inplace.data(), n, d, 1e-6f);
    expect(rel_err(inplace, got, {amax}).max_err == 0.0, "rms_norm in place differs");

    for (int k = 0; k < 2; ++k) {
      const auto kind = kKinds[k];
      const auto &g = c.g[k], &u = c.u[k], &gw = c.want_gate[k];
      const auto gg = gate(g, u, kind);
      std::vector<double> sc(gw.size());
      for (size_t i = 0; i < sc.size(); ++i) sc[i] = std::fabs(g[i] * u[i]) + 1e-6;
      expect(rel_err(gg, gw, sc).max_err <= 3e-6, std::string("gated ") + (kind == ef::Activation::silu ? "silu" : "gelu") + " d=" + std::to_string(d));
    }

    const auto sg = soft(x, d);
    expect(rel_err(sg, c.want_soft, {1.0}).max_err <= 1e-6, "softmax d=" + std::to_string(d));
    double sum = 0;
    for (int64_t i = 0; i < d; ++i) sum += sg[i];
    expect(std::fabs(sum - 1.0) < 1e-5, "softmax row does not sum to 1");
  }
  note_impl("rms_norm");
  note_impl("gated_gelu_tanh");
  note_impl("softmax");

  // RoPE: against the rotate-half formula in double, with partial rotation and freq factors.
  for (const RopeCase& c : rope_cases()) {
    const auto got = rotate(c);
    expect(rel_err(got, c.want, {1.0}).max_err <= 1e-6, "rope vs reference rot_dim=" + std::to_string(c.rot));
    expect(rel_err(got, c.exact, {1.0}).max_err <= 2e-6, "rope vs formula rot_dim=" + std::to_string(c.rot));
  }
  note_impl("rope");

  // argmax / top-k: exact, ties resolved to the lower index, vocab-sized rows.
  for (const PickCase& c : pick_cases()) {
    const int64_t d = c.d, n = c.n;
    const auto& x = c.x;
    const auto ag = arg(x, n, d);
    expect(c.want_arg == ag, "argmax d=" + std::to_string(d));
    for (int64_t t = 0; t < n; ++t) {
      const auto* row = x.data() + t * d;
      expect(ag[t] == std::max_element(row, row + d) - row, "argmax is not the first maximum");
    }
    for (size_t i = 0; i < c.ks.size(); ++i) {
      const int64_t k = c.ks[i];
      const auto& tw = c.want_top[i];
      const auto tg = top(x, n, d, k);
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
