// GEMV / small GEMM, dequantization, activation quantization, row gathers, weight quantizers.
#include <algorithm>
#include <map>

#include "test_util.h"

namespace eftest {
namespace {

using ef::Format;

const Format kAll[] = {Format::f32, Format::f16, Format::q8_0, Format::q4_0, Format::q4_1,
                       Format::q5_0, Format::q4_k, Format::q6_k, Format::q3_k, Format::q4_lut};

std::vector<int64_t> cols_for(Format f) {
  const int be = ef::format_info(f).block_elems;
  if (be == 1) return {1, 7, 33, 100, 640};
  if (be == 256) return {256, 768};
  return {32, 96, 640};
}

// Per-output magnitude sum_c |w[r, c] x[t, c]|: the natural scale of summation-order error.
std::vector<double> magnitudes(const std::vector<float>& wdq, const std::vector<float>& x, int64_t rows, int64_t cols,
                               int64_t n) {
  std::vector<double> m(n * rows);
  for (int64_t t = 0; t < n; ++t)
    for (int64_t r = 0; r < rows; ++r) {
      double s = 0.0;
      for (int64_t c = 0; c < cols; ++c) s += std::fabs(static_cast<double>(wdq[r * cols + c]) * x[t * cols + c]);
      m[t * rows + r] = s;
    }
  return m;
}

std::vector<float> run_matmul(const ef::WeightMatrix& w, const std::vector<float>& x, int64_t n, ef::ActPrecision p) {
  std::vector<float> y(n * w.rows);
  ef::matmul(w, x.data(), n, y.data(), p);
  return y;
}

struct Sqnr {
  double signal = 0.0, noise = 0.0;
};
std::map<std::string, Sqnr> g_sqnr;
bool g_sqnr_printed = false;

// One batch of activations for a weight matrix, the reference twin's products of the two
// (Q8 and, for quantized weights, f32 activations) and the magnitudes the errors are scaled by.
struct Batch {
  int64_t n;
  std::vector<float> x;
  std::vector<double> mag;
  std::vector<float> want, want32;
};

// A random weight matrix in the row layout, dequantized by the reference twin, with its batches.
struct Weights {
  Format f;
  int64_t rows, cols;
  std::vector<uint8_t> wb;
  std::vector<float> wdq;
  std::vector<Batch> batches;
  std::vector<float> x3;  // 3 tokens for the gathered rows
  ef::WeightMatrix matrix() const { return ef::WeightMatrix{wb.data(), wb.size(), f, rows, cols, 0}; }
};

Weights make_weights(Format f, int64_t rows, int64_t cols, std::initializer_list<int64_t> ns, bool f32_acts) {
  Weights c{f, rows, cols, random_weights(f, rows, cols), {}, {}, {}};
  c.wdq = ref_dequant(f, c.wb, rows, cols);
  const ef::WeightMatrix w = c.matrix();
  for (int64_t n : ns) {
    Batch b{n, randn(n * cols), {}, {}, {}};
    b.mag = magnitudes(c.wdq, b.x, rows, cols, n);
    b.want = run_matmul(w, b.x, n, ef::ActPrecision::q8);
    if (f32_acts) b.want32 = run_matmul(w, b.x, n, ef::ActPrecision::f32);
    c.batches.push_back(std::move(b));
  }
  return c;
}

// Every format, a few shapes of each; computed once at the reference level.
const std::vector<Weights>& row_cases() {
  static const std::vector<Weights> cases = reference([] {
    std::vector<Weights> out;
    for (Format f : kAll)
      for (int64_t cols : cols_for(f))
        for (int64_t rows : {1, 7, 33}) {
          out.push_back(make_weights(f, rows, cols, {1, 3, 4, 5, 64}, ef::format_info(f).quantized));
          out.back().x3 = randn(3 * cols);
        }
    return out;
  });
  return cases;
}

// Every format with a panel layout: rows that fill 16-row panels partly, once and twice.
const std::vector<Weights>& panel_cases() {
  static const std::vector<Weights> cases = reference([] {
    std::vector<Weights> out;
    for (Format f : kAll) {
      if (!ef::has_panels(f)) continue;
      for (int64_t cols : cols_for(f))
        for (int64_t rows : {1, 7, 16, 33}) out.push_back(make_weights(f, rows, cols, {1, 3, 8, 9, 64}, false));
    }
    return out;
  });
  return cases;
}

}  // namespace

void test_linear() {
  for (const Weights& wt : row_cases()) {
    const Format f = wt.f;
    const int64_t rows = wt.rows, cols = wt.cols;
    const std::string fmt = ef::format_info(f).name;
    const bool quantized = ef::format_info(f).quantized;
    const ef::WeightMatrix w = wt.matrix();
    const auto& wdq = wt.wdq;
    for (const Batch& b : wt.batches) {
      const int64_t n = b.n;
      const std::string tag = fmt + " rows=" + std::to_string(rows) + " cols=" + std::to_string(cols) +
                              " n=" + std::to_string(n);
      const auto got = run_matmul(w, b.x, n, ef::ActPrecision::q8);
      const auto e = rel_err(got, b.want, b.mag);
      expect(e.max_err <= 3e-5, "matmul " + tag + ": error " + std::to_string(e.max_err) + " > 3e-5 of sum|w x|");
      if (quantized) {
        // f32 activations (dequantize, then float GEMM): against the reference twin and exact math.
        const auto& want32 = b.want32;
        const auto got32 = run_matmul(w, b.x, n, ef::ActPrecision::f32);
        const auto e32 = rel_err(got32, want32, b.mag);
        expect(e32.max_err <= 1e-5, "matmul f32-act " + tag + ": error " + std::to_string(e32.max_err));
        // Accuracy cost of Q8 activations against exact f32 activations.
        Sqnr& s = g_sqnr[fmt];
        for (size_t i = 0; i < got.size(); ++i) {
          s.signal += static_cast<double>(want32[i]) * want32[i];
          s.noise += (static_cast<double>(got[i]) - want32[i]) * (static_cast<double>(got[i]) - want32[i]);
        }
      }
    }
    // Dequantization against the reference twin.
    std::vector<float> dq(rows * cols);
    ef::dequantize_rows(w, nullptr, rows, dq.data());
    double amax = 0.0;
    for (float v : wdq) amax = std::max(amax, static_cast<double>(std::fabs(v)));
    const auto ed = rel_err(dq, wdq, {amax});
    expect(ed.max_err <= 1e-6, "dequantize " + fmt + ": error " + std::to_string(ed.max_err));
    // Gathered rows (with a repeat) equal the same rows of the full product.
    std::vector<int32_t> ids = {static_cast<int32_t>(rows - 1), 0, static_cast<int32_t>(rows / 2), 0};
    const int64_t n = 3;
    const auto& x = wt.x3;
    const auto full = run_matmul(w, x, n, ef::ActPrecision::q8);
    std::vector<float> part(n * ids.size());
    ef::matmul_rows(w, ids.data(), ids.size(), x.data(), n, part.data());
    bool same = true;
    for (int64_t t = 0; t < n; ++t)
      for (size_t i = 0; i < ids.size(); ++i) same &= part[t * ids.size() + i] == full[t * rows + ids[i]];
    expect(same, "matmul_rows " + fmt + " differs from the rows of matmul");
    std::vector<float> drows(ids.size() * cols);
    ef::dequantize_rows(w, ids.data(), ids.size(), drows.data());
    same = true;
    for (size_t i = 0; i < ids.size(); ++i)
      for (int64_t c = 0; c < cols; ++c) same &= drows[i * cols + c] == dq[ids[i] * cols + c];
    expect(same, "dequantize_rows " + fmt + " differs from full dequantization");
  }
  for (Format f : kAll) {
    const std::string fmt = ef::format_info(f).name;
    note_impl(ef::format_info(f).quantized ? "gemm_q8_" + fmt : "gemm_f32_" + fmt);
    note_impl("dequant_" + fmt);
  }
  note_impl("gemm_f32_f32");

  // The panel layout: a lossless reordering (unpacks to the same bytes) that every GEMM path runs
  // like the row layout: against the reference twin on rows, f32 activations, dequantized rows.
  for (const Weights& wt : panel_cases()) {
    const Format f = wt.f;
    const int64_t rows = wt.rows, cols = wt.cols;
    const std::string fmt = ef::format_info(f).name;
    const auto& wb = wt.wb;
    const ef::WeightMatrix w = wt.matrix();
    std::vector<uint8_t> pb(ef::panel_bytes(f, rows, cols));
    ef::pack_panels(w, pb.data(), pb.size());
    std::vector<uint8_t> back(wb.size());
    const ef::WeightMatrix wp{pb.data(), pb.size(), f, rows, cols, 0, ef::Layout::panels};
    ef::unpack_panels(wp, back.data(), back.size());
    expect(back == wb, "panels " + fmt + ": unpacking does not give the rows back");
    for (const Batch& b : wt.batches) {
      const int64_t n = b.n;
      const auto& x = b.x;
      const std::string tag = fmt + " rows=" + std::to_string(rows) + " cols=" + std::to_string(cols) +
                              " n=" + std::to_string(n);
      const auto got = run_matmul(wp, x, n, ef::ActPrecision::q8);
      const auto e = rel_err(got, b.want, b.mag);
      expect(e.max_err <= 3e-5, "matmul panels " + tag + ": error " + std::to_string(e.max_err));
      // AVX-512 and AVX2 run rows and panels through the same arithmetic (rows transposed on the
      // fly), so an arena read in place (rows) and laid out at load (panels) give the same floats.
      if (ef::current_isa() == "avx512" || (ef::current_isa() == "avx2" && f != Format::q4_lut))
        expect(got == run_matmul(w, x, n, ef::ActPrecision::q8), "matmul panels " + tag + " differs from the rows");
      const auto got32 = run_matmul(wp, x, n, ef::ActPrecision::f32);
      expect(got32 == run_matmul(w, x, n, ef::ActPrecision::f32), "matmul f32-act panels " + tag +
                                                                      " differs from the row layout");
    }
    std::vector<int32_t> ids = {static_cast<int32_t>(rows - 1), 0, static_cast<int32_t>(rows / 2)};
    std::vector<float> a(ids.size() * cols), b(ids.size() * cols);
    ef::dequantize_rows(w, ids.data(), ids.size(), a.data());
    ef::dequantize_rows(wp, ids.data(), ids.size(), b.data());
    expect(a == b, "dequantize_rows panels " + fmt + " differs from the row layout");
  }
  for (Format f : kAll)
    if (ef::has_panels(f)) note_impl("gemm_q8_panels_" + std::string(ef::format_info(f).name));

  // Several matrices in one pass (q, k, v; gate, up): each output equals its own matmul exactly,
  // in either layout and any mix of formats.
  {
    const int64_t cols = 512;
    const std::pair<Format, int64_t> parts[] = {{Format::q4_k, 48}, {Format::q8_0, 16}, {Format::q6_k, 7},
                                                {Format::q5_0, 33}};
    std::vector<std::vector<uint8_t>> bufs;
    std::vector<ef::WeightMatrix> ws;
    for (const auto& [f, rows] : parts) {
      bufs.push_back(random_weights(f, rows, cols));
      ws.push_back(ef::WeightMatrix{bufs.back().data(), bufs.back().size(), f, rows, cols, 0});
    }
    std::vector<uint8_t> pb(ef::panel_bytes(Format::q4_k, 48, cols));
    ef::pack_panels(ws[0], pb.data(), pb.size());
    ws.push_back(ef::WeightMatrix{pb.data(), pb.size(), Format::q4_k, 48, cols, 0, ef::Layout::panels});
    for (int64_t n : {1, 2, 9}) {
      const auto x = randn(n * cols);
      ef::QuantizedActs xq;
      xq.quantize(x.data(), n, cols);
      std::vector<std::vector<float>> ys;
      std::vector<float*> yp;
      for (const auto& w : ws) ys.emplace_back(n * w.rows);
      for (auto& y : ys) yp.push_back(y.data());
      ef::matmul_multi(ws.data(), yp.data(), static_cast<int>(ws.size()), xq);
      for (size_t i = 0; i < ws.size(); ++i) {
        std::vector<float> one(n * ws[i].rows);
        ef::matmul(ws[i], xq, one.data());
        expect(one == ys[i], "matmul_multi output " + std::to_string(i) + " n=" + std::to_string(n) +
                                 " differs from its own matmul");
      }
    }
  }

  // Q8 activation codes and scales are bit-identical at every level (same rounding rules).
  {
    const int64_t n = 5, cols = 640;
    auto x = randn(n * cols, 3.0f);
    x[7] = 0.0f;
    std::fill(x.begin() + 64, x.begin() + 96, 0.0f);  // an all-zero block
    ef::QuantizedActs a, b;
    under("ref", [&] { a.quantize(x.data(), n, cols); return 0; });
    b.quantize(x.data(), n, cols);
    expect(std::memcmp(a.q(), b.q(), n * cols) == 0, "quantized activation codes differ from the reference");
    expect(std::memcmp(a.d(), b.d(), n * cols / 32 * 4) == 0, "activation scales differ from the reference");
    expect(std::memcmp(a.s16(), b.s16(), n * cols / 16 * 4) == 0, "activation half sums differ from the reference");
    note_impl("quantize_acts");
  }

  // Weight quantizers: round trip error within what each format can represent.
  {
    const int64_t rows = 9, cols = 256;
    const auto x = randn(rows * cols);
    const std::pair<Format, double> limits[] = {{Format::q8_0, 0.01}, {Format::q4_0, 0.15}, {Format::q4_1, 0.12},
                                                {Format::q5_0, 0.07}, {Format::q4_lut, 0.12}, {Format::f16, 1e-3}};
    for (const auto& [f, lim] : limits) {
      std::vector<uint8_t> q(ef::row_bytes(f, cols) * rows);
      ef::quantize_rows(x.data(), rows, cols, f, q.data(), q.size());
      const auto back = ref_dequant(f, q, rows, cols);
      double num = 0.0, den = 0.0;
      for (size_t i = 0; i < x.size(); ++i) num += (back[i] - x[i]) * (back[i] - x[i]), den += x[i] * x[i];
      const double rel = std::sqrt(num / den);
      expect(rel <= lim, std::string("quantize_rows ") + ef::format_info(f).name + ": relative RMS error " +
                             std::to_string(rel) + " > " + std::to_string(lim));
    }
  }

  if (!g_sqnr_printed) {
    g_sqnr_printed = true;
    for (const auto& [fmt, s] : g_sqnr) {
      const double db = 10.0 * std::log10(s.signal / std::max(s.noise, 1e-300));
      std::printf("Q8-activation SQNR vs f32 activations, %s weights: %.1f dB\n", fmt.c_str(), db);
      expect(db >= 35.0, "Q8 activation SQNR for " + fmt + " is only " + std::to_string(db) + " dB");
    }
  }
}

}  // namespace eftest
