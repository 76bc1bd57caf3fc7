// Sparse FFN over a neuron-bundle arena: against the reference twin, against plain math on the
// dequantized bundles, thresholds, accumulation and duplicate slots.
#include <algorithm>

#include "test_util.h"

namespace eftest {
namespace {

using ef::Format;

struct Arena {
  std::vector<uint8_t> bytes;
  ef::NeuronArena view;
  std::vector<float> gate, up, down;  // dequantized [n_slots, d_model] each
};

Arena make_arena(Format g, Format u, Format d, int64_t n_slots, int64_t dm, size_t pad) {
  Arena a;
  const size_t rg = ef::row_bytes(g, dm), ru = ef::row_bytes(u, dm), rd = ef::row_bytes(d, dm);
  const size_t stride = rg + ru + rd + pad;
  a.bytes.assign(stride * n_slots, 0xAB);
  const auto wg = random_weights(g, n_slots, dm), wu = random_weights(u, n_slots, dm), wd = random_weights(d, n_slots, dm);
  for (int64_t s = 0; s < n_slots; ++s) {
    std::memcpy(a.bytes.data() + s * stride, wg.data() + s * rg, rg);
    std::memcpy(a.bytes.data() + s * stride + rg, wu.data() + s * ru, ru);
    std::memcpy(a.bytes.data() + s * stride + rg + ru, wd.data() + s * rd, rd);
  }
  a.gate = ref_dequant(g, wg, n_slots, dm);
  a.up = ref_dequant(u, wu, n_slots, dm);
  a.down = ref_dequant(d, wd, n_slots, dm);
  a.view = ef::NeuronArena{a.bytes.data(), a.bytes.size(), n_slots, dm, g, u, d, stride};
  return a;
}

double act(double v, ef::Activation k) {
  if (k == ef::Activation::silu) return v / (1.0 + std::exp(-v));
  return 0.5 * v * (1.0 + std::tanh(0.7978845608028654 * (v + 0.044715 * v * v * v)));
}

std::vector<float> run(const Arena& a, const std::vector<float>& x, int64_t n_tok, const std::vector<int32_t>& slots,
                       ef::Activation k, const float* thr, std::vector<float> out = {}) {
  const bool acc = !out.empty();
  if (!acc) out.assign(n_tok * a.view.d_model, 0.0f);
  ef::ffn_sparse(a.view, x.data(), n_tok, slots.data(), slots.size(), k, thr, out.data(), acc);
  return out;
}

}  // namespace

// Exact math of matmul_columns: out[t, c] = sum_r h[t, r] w[r, c] in double, and mag[t, c] the sum
// of the terms' magnitudes (the scale of the error a quantized product may make).
std::vector<float> columns_exact(const std::vector<float>& h, const std::vector<float>& wd, int64_t n, int64_t rows,
                                 int64_t cols, std::vector<double>& mag) {
  std::vector<float> exact(n * cols);
  mag.assign(n * cols, 0.0);
  for (int64_t t = 0; t < n; ++t)
    for (int64_t c = 0; c < cols; ++c) {
      double o = 0.0;
      for (int64_t r = 0; r < rows; ++r) o += double(h[t * rows + r]) * wd[r * cols + c], mag[t * cols + c] += std::fabs(double(h[t * rows + r]) * wd[r * cols + c]);
      exact[t * cols + c] = static_cast<float>(o);
    }
  return exact;
}

namespace {

struct Combo {
  Format g, u, d;
  int64_t dm;
};
const Combo kCombos[] = {{Format::q8_0, Format::q8_0, Format::q8_0, 96},
                         {Format::q4_0, Format::q4_1, Format::q5_0, 640},
                         {Format::f16, Format::f32, Format::f16, 64},
                         {Format::q4_lut, Format::q4_lut, Format::q8_0, 128},
                         {Format::q8_0, Format::f16, Format::q4_0, 96},
                         {Format::q6_k, Format::q4_k, Format::q6_k, 512},
                         {Format::q4_k, Format::q5_0, Format::q4_k, 256},
                         {Format::q4_0, Format::q4_0, Format::q4_lut, 96},
                         {Format::f32, Format::q8_0, Format::f32, 64},
                         {Format::q5_0, Format::q8_0, Format::q4_1, 64}};
const ef::Activation kActs[] = {ef::Activation::silu, ef::Activation::gelu_tanh};

std::string ffn_tag(const Combo& cb) {
  return std::string(ef::format_info(cb.g).name) + "/" + ef::format_info(cb.u).name + "/" + ef::format_info(cb.d).name +
         " d_model=" + std::to_string(cb.dm);
}

// Tokens through one arena: the reference twin's output and plain math in double on the
// dequantized bundles (with mag, the sum of the magnitudes of its terms).
struct FfnBatch {
  ef::Activation kind;
  int64_t n_tok;
  std::vector<float> x, want, exact;
  std::vector<double> mag;
};

struct FfnCase {
  Combo cb;
  Arena a;
  std::vector<int32_t> slots;
  std::vector<FfnBatch> batches;
};

const std::vector<FfnCase>& ffn_cases() {
  static const std::vector<FfnCase> cases = reference([] {
    std::vector<FfnCase> out;
    for (const auto& cb : kCombos) {
      const int64_t n_slots = 70, dm = cb.dm;
      FfnCase fc{cb, make_arena(cb.g, cb.u, cb.d, n_slots, dm, 16), {}, {}};
      const Arena& a = fc.a;
      auto& slots = fc.slots;
      for (int i = 0; i < 53; ++i) slots.push_back(static_cast<int32_t>((i * 37 + 5) % n_slots));
      slots.push_back(slots[3]);  // a duplicate counts twice
      for (auto kind : kActs) {
        for (int64_t n_tok : {1, 3, 64}) {
          FfnBatch b{kind, n_tok, randn(n_tok * dm), {}, {}, {}};
          const auto& x = b.x;
          b.want = run(a, x, n_tok, slots, kind, nullptr);
          // Plain math in double on the dequantized bundles, fed the activations each part sees:
          // Q8-rounded (codes * block scale) for quantized gate/up rows, f32 for float rows.
          ef::QuantizedActs xq;
          xq.quantize(x.data(), n_tok, dm);
          std::vector<float> xr(n_tok * dm);
          for (int64_t i = 0; i < n_tok * dm; ++i) xr[i] = xq.q()[i] * xq.d()[i / 32];
          const std::vector<float>& xg = ef::format_info(cb.g).quantized ? xr : x;
          const std::vector<float>& xu = ef::format_info(cb.u).quantized ? xr : x;
          auto& exact = b.exact;
          auto& mag = b.mag;
          exact.assign(n_tok * dm, 0.0f);
          mag.assign(n_tok * dm, 0.0);
          for (int64_t t = 0; t < n_tok; ++t) {
            std::vector<double> o(dm, 0.0);
            for (int32_t s : slots) {
              double g = 0.0, u = 0.0;
              for (int64_t c = 0; c < dm; ++c) g += a.gate[s * dm + c] * xg[t * dm + c], u += a.up[s * dm + c] * xu[t * dm + c];
              const double h = act(g, kind) * u;
              for (int64_t c = 0; c < dm; ++c) o[c] += h * a.down[s * dm + c], mag[t * dm + c] += std::fabs(h * a.down[s * dm + c]);
            }
            for (int64_t c = 0; c < dm; ++c) exact[t * dm + c] = static_cast<float>(o[c]);
          }
          const auto es = rel_err(b.want, exact, mag, 1e-6);
          expect(es.max_err <= 1e-4, "ffn_sparse reference vs exact math " + ffn_tag(cb) + " n_tok=" + std::to_string(n_tok) +
                                         ": " + std::to_string(es.max_err));
          fc.batches.push_back(std::move(b));
        }
      }
      out.push_back(std::move(fc));
    }
    return out;
  });
  return cases;
}

// Tokens through a matrix stored by columns: the reference twin's product and exact math.
struct ColumnsBatch {
  int64_t n;
  std::vector<float> h, want, exact;
  std::vector<double> mag;
};

struct ColumnsCase {
  Format f;
  int64_t rows, cols;
  ef::ColumnActs acts;
  std::vector<uint8_t> w, packed;  // packed: column panels (q8_0 with whole groups of 32 rows)
  std::vector<ColumnsBatch> batches;
  ef::WeightMatrix matrix() const { return ef::WeightMatrix{w.data(), w.size(), f, rows, cols}; }
  ef::WeightMatrix panels() const {
    return ef::WeightMatrix{packed.data(), packed.size(), f, rows, cols, 0, ef::Layout::panels};
  }
};

ColumnsBatch columns_batch(const ef::WeightMatrix& m, const std::vector<float>& wd, int64_t n, ef::ColumnActs acts) {
  ColumnsBatch b{n, randn(n * m.rows), std::vector<float>(n * m.cols), {}, {}};
  ef::matmul_columns(m, b.h.data(), n, b.want.data(), acts);
  b.exact = columns_exact(b.h, wd, n, m.rows, m.cols, b.mag);
  return b;
}

// f32 coefficients over every format matmul_columns reads: 300 rows, more than one group of
// the tiled kernels.
const std::vector<ColumnsCase>& columns_cases() {
  static const std::vector<ColumnsCase> cases = reference([] {
    std::vector<ColumnsCase> out;
    for (Format f : {Format::q8_0, Format::q4_0, Format::q5_0, Format::q4_1, Format::q4_lut, Format::f16}) {
      const int64_t rows = 300, cols = 96;
      ColumnsCase cc{f, rows, cols, ef::ColumnActs::f32, random_weights(f, rows, cols), {}, {}};
      const auto wd = ref_dequant(f, cc.w, rows, cols);
      for (int64_t n : {1, 5, 20}) cc.batches.push_back(columns_batch(cc.matrix(), wd, n, cc.acts));
      out.push_back(std::move(cc));
    }
    return out;
  });
  return cases;
}

// int8 coefficients of q8_0 columns: 96 rows (3 groups of 32, also as column panels) and 61 rows
// (rows layout only, ending in a partial group). The reference twin reads the column panels
// exactly as it reads the rows.
const std::vector<ColumnsCase>& columns_q8_cases() {
  static const std::vector<ColumnsCase> cases = reference([] {
    std::vector<ColumnsCase> out;
    for (const int64_t rows : {96, 61}) {
      const int64_t cols = 160;
      const auto w = random_weights(Format::q8_0, rows, cols);
      const auto wd = ref_dequant(Format::q8_0, w, rows, cols);
      std::vector<uint8_t> packed(w.size());
      if (rows % 32 == 0)
        ef::pack_columns(ef::WeightMatrix{w.data(), w.size(), Format::q8_0, rows, cols}, packed.data(), packed.size());
      for (auto acts : {ef::ColumnActs::q8, ef::ColumnActs::q8x2}) {
        ColumnsCase cc{Format::q8_0, rows, cols, acts, w, packed, {}};
        for (int64_t n : {1, 6, 19}) {
          cc.batches.push_back(columns_batch(cc.matrix(), wd, n, acts));
          if (rows % 32 == 0) {
            const ColumnsBatch& b = cc.batches.back();
            std::vector<float> from_panels(n * cols);
            ef::matmul_columns(cc.panels(), b.h.data(), n, from_panels.data(), acts);
            expect(from_panels == b.want, std::string("matmul_columns q8_0 ") + (acts == ef::ColumnActs::q8x2 ? "q8x2" : "q8") +
                                              " rows=" + std::to_string(rows) +
                                              ": column panels differ from the rows at ref, n=" + std::to_string(n));
          }
        }
        out.push_back(std::move(cc));
      }
    }
    return out;
  });
  return cases;
}

}  // namespace

void test_ffn() {
  for (const FfnCase& fc : ffn_cases()) {
    const Combo& cb = fc.cb;
    const int64_t n_slots = 70, dm = cb.dm;
    const Arena& a = fc.a;
    const auto& slots = fc.slots;
    const std::string tag = ffn_tag(cb);
    for (const FfnBatch& b : fc.batches) {
      const int64_t n_tok = b.n_tok;
      const auto& x = b.x;
      const auto& mag = b.mag;
      const auto got = run(a, x, n_tok, slots, b.kind, nullptr);
      const std::string ctx = tag + " n_tok=" + std::to_string(n_tok);
      const auto e = rel_err(got, b.want, mag, 1e-6);
      expect(e.max_err <= 1e-4, "ffn_sparse vs reference " + ctx + ": " + std::to_string(e.max_err));
      // accumulate adds onto what is there
      std::vector<float> base(n_tok * dm, 0.5f);
      const auto acc = run(a, x, n_tok, slots, b.kind, nullptr, base);
      bool ok = true;
      for (size_t i = 0; i < acc.size(); ++i) ok &= std::fabs(acc[i] - (got[i] + 0.5f)) <= 1e-4 * (1.0 + mag[i]);
      expect(ok, "ffn_sparse accumulate " + ctx);
    }
    for (auto kind : kActs) {
      // Thresholds: one token; the result equals the unthresholded FFN over the surviving slots.
      const auto x = randn(dm);
      std::vector<float> g(slots.size());
      ef::matmul_rows(ef::WeightMatrix{a.bytes.data(), a.bytes.size(), cb.g, n_slots, dm, a.view.stride}, slots.data(),
                      slots.size(), x.data(), 1, g.data());
      std::vector<float> mags;
      // the kernel tests |act(gate . x)| (CATS), not |gate . x|
      auto act_mag = [&](float v) {
        return std::fabs(kind == ef::Activation::silu ? v / (1.0f + std::exp(-v))
                                                      : 0.5f * v * (1.0f + std::tanh(0.7978845608f * (v + 0.044715f * v * v * v))));
      };
      for (float v : g) mags.push_back(act_mag(v));
      std::sort(mags.begin(), mags.end());
      // Threshold in the middle of a clear gap, near the median if there is one there. Strongly negative
      // gates all give |act| = 0 exactly, so the middle third can be one run of zeros: then the widest gap.
      auto widest_gap = [&](size_t lo, size_t hi) {
        size_t best = lo;
        for (size_t i = lo; i + 1 < hi; ++i)
          if (mags[i + 1] - mags[i] > mags[best + 1] - mags[best]) best = i;
        return best;
      };
      size_t gap = widest_gap(mags.size() / 3, 2 * mags.size() / 3);
      if (!(mags[gap + 1] > mags[gap])) gap = widest_gap(0, mags.size());
      const float thr = 0.5f * (mags[gap] + mags[gap + 1]);
      std::vector<int32_t> kept;
      for (size_t i = 0; i < slots.size(); ++i)
        if (act_mag(g[i]) >= thr) kept.push_back(slots[i]);
      expect(!kept.empty() && kept.size() < slots.size(), "ffn_sparse threshold test keeps a proper subset");
      const auto with_thr = run(a, x, 1, slots, kind, &thr);
      const auto subset = run(a, x, 1, kept, kind, nullptr);
      const auto ref_thr = under("ref", [&] { return run(a, x, 1, slots, kind, &thr); });
      double scale = 1e-6;
      for (float v : subset) scale = std::max(scale, static_cast<double>(std::fabs(v)));
      expect(rel_err(with_thr, subset, {scale}).max_err <= 1e-4, "ffn_sparse thresholds " + tag + " differ from the kept subset");
      expect(rel_err(with_thr, ref_thr, {scale}).max_err <= 1e-4, "ffn_sparse thresholds " + tag + " differ from the reference");
    }
  }
  // matmul_columns: a matrix stored by columns (a bundle's down columns), more rows than one group
  // of the tiled kernels, split over threads by output blocks; against the reference twin and
  // plain math, and each token alone equal to its row in the batch.
  for (const ColumnsCase& cc : columns_cases()) {
    const ef::WeightMatrix m = cc.matrix();
    const int64_t rows = cc.rows, cols = cc.cols;
    const std::string tag = std::string("matmul_columns ") + ef::format_info(cc.f).name;
    for (const ColumnsBatch& b : cc.batches) {
      const int64_t n = b.n;
      const auto& h = b.h;
      std::vector<float> got(n * cols);
      ef::matmul_columns(m, h.data(), n, got.data());
      expect(rel_err(got, b.want, b.mag, 1e-6).max_err <= 5e-5, tag + " vs reference, n=" + std::to_string(n));
      expect(rel_err(got, b.exact, b.mag, 1e-6).max_err <= 5e-5, tag + " vs exact math, n=" + std::to_string(n));
      if (n > 1) {
        std::vector<float> one(cols);
        ef::matmul_columns(m, h.data() + (n - 1) * rows, 1, one.data());
        expect(std::equal(one.begin(), one.end(), got.begin() + (n - 1) * cols), tag + ": a token alone differs from its row in a batch");
      }
    }
  }
  // matmul_columns on int8 coefficients (ColumnActs q8 / q8x2) of q8_0 columns, from rows and from
  // column panels: bit-identical to the scalar twin, within the int8 rounding of exact math, each
  // token alone equal to its row in a batch. 96 rows are 3 groups of 32; 61 rows (rows layout
  // only) end in a partial group; 5 blocks split unevenly over 2 threads.
  for (const ColumnsCase& cc : columns_q8_cases()) {
    const ef::WeightMatrix m = cc.matrix(), mp = cc.panels();
    const int64_t rows = cc.rows, cols = cc.cols;
    const auto acts = cc.acts;
    const bool two = acts == ef::ColumnActs::q8x2;
    const std::string tag = std::string("matmul_columns q8_0 ") + (two ? "q8x2" : "q8") + " rows=" + std::to_string(rows);
    for (const ColumnsBatch& b : cc.batches) {
      const int64_t n = b.n;
      const auto& h = b.h;
      const auto& want = b.want;
      std::vector<float> got(n * cols), from_panels(n * cols);
      ef::matmul_columns(m, h.data(), n, got.data(), acts);
      expect(got == want, tag + ": differs from the scalar twin, n=" + std::to_string(n));
      if (rows % 32 == 0) {
        ef::matmul_columns(mp, h.data(), n, from_panels.data(), acts);
        expect(from_panels == want, tag + ": column panels differ from the rows, n=" + std::to_string(n));
      }
      // int8 coefficients: measured up to 4e-3 (q8) and 2e-5 (q8x2) of sum |h w| on random data
      const double tol = two ? 2e-4 : 2e-2;
      expect(rel_err(got, b.exact, b.mag, 1e-6).max_err <= tol, tag + " vs exact math, n=" + std::to_string(n));
      if (n > 1) {
        std::vector<float> one(cols);
        ef::matmul_columns(m, h.data() + (n - 1) * rows, 1, one.data(), acts);
        expect(std::equal(one.begin(), one.end(), got.begin() + (n - 1) * cols), tag + ": a token alone differs from its row in a batch");
      }
    }
  }
  if (level() == "avx512") {
    note_impl("columns_q8_q8_0");
    note_impl("columns_q8_packed_q8_0");
  }
  for (const char* f : {"q8_0", "q4_0", "q4_1", "q5_0", "q4_k", "q6_k", "q3_k", "q4_lut", "f16", "f32"})
    note_impl(std::string("ffn_down_") + f);
  note_impl("gated_silu");
}

}  // namespace eftest
