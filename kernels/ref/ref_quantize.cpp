// Weight quantizers (export time, scalar). The GGML 32-block formats round exactly like
// ggml's reference quantizers so bundles written here match llama.cpp's files bit for bit.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "edgeflash/kernels.h"

namespace ef {
namespace {

void store_fp16(uint8_t* p, float v) {
  const uint16_t h = f32_to_fp16(v);
  std::memcpy(p, &h, 2);
}

// The element of largest magnitude, with its sign (the first one on ties, like ggml).
float signed_absmax(const float* x, int n) {
  float amax = 0.0f, mx = 0.0f;
  for (int k = 0; k < n; ++k) {
    if (std::fabs(x[k]) > amax) {
      amax = std::fabs(x[k]);
      mx = x[k];
    }
  }
  return mx;
}

void quantize_q8_0(const float* x, int64_t cols, uint8_t* out) {
  for (int64_t b = 0; b < cols / 32; ++b, x += 32, out += 34) {
    float amax = 0.0f;
    for (int k = 0; k < 32; ++k) amax = std::max(amax, std::fabs(x[k]));
    const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
    store_fp16(out, d);
    for (int k = 0; k < 32; ++k) out[2 + k] = static_cast<uint8_t>(static_cast<int8_t>(std::round(x[k] * id)));
  }
}

void quantize_q4_0(const float* x, int64_t cols, uint8_t* out) {
  for (int64_t b = 0; b < cols / 32; ++b, x += 32, out += 18) {
    const float d = signed_absmax(x, 32) / -8.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
    store_fp16(out, d);
    for (int k = 0; k < 16; ++k) {
      const uint8_t q0 = std::min<uint8_t>(15, static_cast<uint8_t>(static_cast<int8_t>(x[k] * id + 8.5f)));
      const uint8_t q1 = std::min<uint8_t>(15, static_cast<uint8_t>(static_cast<int8_t>(x[k + 16] * id + 8.5f)));
      out[2 + k] = static_cast<uint8_t>(q0 | (q1 << 4));
    }
  }
}

void quantize_q4_1(const float* x, int64_t cols, uint8_t* out) {
  for (int64_t b = 0; b < cols / 32; ++b, x += 32, out += 20) {
    float lo = x[0], hi = x[0];
    for (int k = 1; k < 32; ++k) lo = std::min(lo, x[k]), hi = std::max(hi, x[k]);
    const float d = (hi - lo) / 15.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
    store_fp16(out, d);
    store_fp16(out + 2, lo);
    for (int k = 0; k < 16; ++k) {
      const uint8_t q0 = std::min<uint8_t>(15, static_cast<uint8_t>(static_cast<int8_t>((x[k] - lo) * id + 0.5f)));
      const uint8_t q1 =
          std::min<uint8_t>(15, static_cast<uint8_t>(static_cast<int8_t>((x[k + 16] - lo) * id + 0.5f)));
      out[4 + k] = static_cast<uint8_t>(q0 | (q1 << 4));
    }
  }
}

void quantize_q5_0(const float* x, int64_t cols, uint8_t* out) {
  for (int64_t b = 0; b < cols / 32; ++b, x += 32, out += 22) {
    const float d = signed_absmax(x, 32) / -16.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
    store_fp16(out, d);
    uint32_t qh = 0;
    for (int k = 0; k < 16; ++k) {
      const uint8_t q0 = std::min<uint8_t>(31, static_cast<uint8_t>(static_cast<int8_t>(x[k] * id + 16.5f)));
      const uint8_t q1 = std::min<uint8_t>(31, static_cast<uint8_t>(static_cast<int8_t>(x[k + 16] * id + 16.5f)));
      out[6 + k] = static_cast<uint8_t>((q0 & 15) | ((q1 & 15) << 4));
      qh |= static_cast<uint32_t>(q0 >> 4) << k;
      qh |= static_cast<uint32_t>(q1 >> 4) << (k + 16);
    }
    std::memcpy(out + 2, &qh, 4);
  }
}

// q3_k (GGML layout: hmask[32], qs[64], 12 scale bytes, fp16 d; codes 0..7 stand for -4..3).
// Per 16-element sub-block a scale s fitted by least squares: for each candidate step the codes
// are rounded, s is the least-squares scale of those codes, and the candidate with the smallest
// squared error wins. The 16 scales are then quantized to 6 signed bits under one d per
// super-block (the largest-magnitude scale lands on -32; each integer scale is the nearest one or
// a neighbour, whichever codes the sub-block with less error), and every code is rounded again
// with the scale it will actually be multiplied by.
constexpr float kQ3Steps[] = {2.5f, 2.75f, 3.0f, 3.25f, 3.5f, 3.75f, 4.0f, 4.5f};

// The squared-error-minimizing scale of 16 values over a few code grids (0 for an all-zero block).
float q3_k_subblock_scale(const float* x) {
  float amax = 0.0f;
  for (int k = 0; k < 16; ++k) amax = std::max(amax, std::fabs(x[k]));
  if (amax == 0.0f) return 0.0f;
  double best_err = 0.0, best = 0.0;
  bool have = false;
  for (float sign : {1.0f, -1.0f}) {  // a negative scale gives the 4th level to positive values
    for (float step : kQ3Steps) {
      const float inv = sign * step / amax;
      double sxq = 0.0, sqq = 0.0, sxx = 0.0;
      for (int k = 0; k < 16; ++k) {
        const float q = std::clamp(std::nearbyint(x[k] * inv), -4.0f, 3.0f);
        sxq += static_cast<double>(x[k]) * q, sqq += static_cast<double>(q) * q, sxx += static_cast<double>(x[k]) * x[k];
      }
      if (sqq == 0.0) continue;
      const double s = sxq / sqq, err = sxx - sxq * s;  // error of the least-squares scale
      if (!have || err < best_err) have = true, best_err = err, best = s;
    }
  }
  return static_cast<float>(best);
}

int q3_k_code(float x, float ie) { return static_cast<int>(std::clamp(std::nearbyint(x * ie), -4.0f, 3.0f)) + 4; }

// Squared error of 16 values coded with the effective scale eff (codes re-rounded to it).
double q3_k_error(const float* x, float eff) {
  const float ie = eff != 0.0f ? 1.0f / eff : 0.0f;
  double err = 0.0;
  for (int k = 0; k < 16; ++k) {
    const double e = x[k] - static_cast<double>(eff) * (q3_k_code(x[k], ie) - 4);
    err += e * e;
  }
  return err;
}

void quantize_q3_k(const float* x, int64_t cols, uint8_t* out) {
  for (int64_t b = 0; b < cols / 256; ++b, x += 256, out += 110) {
    std::memset(out, 0, 110);
    float s[16];
    for (int j = 0; j < 16; ++j) s[j] = q3_k_subblock_scale(x + 16 * j);
    const float smax = signed_absmax(s, 16);
    store_fp16(out + 108, smax / -32.0f);
    const float d = load_fp16(out + 108), id = d != 0.0f ? 1.0f / d : 0.0f;
    uint8_t* hmask = out;
    uint8_t* qs = out + 32;
    uint8_t* scales = out + 96;
    for (int j = 0; j < 16; ++j) {
      // the integer scale nearest s / d, or a neighbour when its re-rounded codes fit better
      const int nearest = static_cast<int>(std::clamp(std::nearbyint(s[j] * id), -32.0f, 31.0f));
      int sc = nearest;
      double best_err = -1.0;
      for (int c = std::max(-32, nearest - 1); c <= std::min(31, nearest + 1); ++c) {
        const double err = q3_k_error(x + 16 * j, d * static_cast<float>(c));
        if (best_err < 0.0 || err < best_err) best_err = err, sc = c;
      }
      const int v = sc + 32;  // low nibble in byte j % 8 (nibble j / 8), high bits in byte 8 + j % 4 (pair j / 4)
      scales[j % 8] |= static_cast<uint8_t>((v & 15) << (4 * (j / 8)));
      scales[8 + j % 4] |= static_cast<uint8_t>((v >> 4) << (2 * (j / 4)));
      const float eff = d * static_cast<float>(sc), ie = eff != 0.0f ? 1.0f / eff : 0.0f;
      for (int k = 0; k < 16; ++k) {
        const int e = 16 * j + k, half = e / 128, unit = (e % 128) / 32, l = e % 32;
        const int code = q3_k_code(x[e], ie);
        qs[32 * half + l] |= static_cast<uint8_t>((code & 3) << (2 * unit));
        hmask[l] |= static_cast<uint8_t>((code >> 2) << (4 * half + unit));
      }
    }
  }
}

// q4_lut per row (docs/weight-formats.md): 16 int8 levels, f32 scale s, per block of 32 a code k
// with block scale s * k^2. The fit (edgeflash.export.quant.q4_lut describes it step by step):
// levels from a 1-D k-means over the block-normalized values u = x / d_b on a histogram of
// 1/2-level bins, value j weighted by w_j^kLutPower * d_b^2 (w = per-column importance, E[x_j^2]
// of the activations; 1 without calibration); per block the best of seven candidate scales (the
// previous round's, six around max|x| / 127), each the w-weighted least-squares scale of its
// nearest-level indices; kLutRounds rounds of both; scales rounded to s * k^2; indices last.
constexpr int kLutRounds = 4;
// The k-means weighs columns by a damped importance: with w_j itself a few heavy columns take a
// level each and the rest of the row gets too few. Held-out perplexity (docs/export.md) with
// powers 0, 0.25, 0.35, 0.5, 0.75 on SmolLM2 put 0.25-0.35 ahead on prose; 0.35 kept Gemma 3 close.
constexpr double kLutPower = 0.35;
constexpr int kLutColdIterations = 20, kLutWarmIterations = 6;
constexpr double kLutConverged = 0.02;  // centroid moves below this no longer change the rounded levels
constexpr int kLutBins = 509;           // bins of 1/2 level over [-127, 127]
constexpr int kLutHalfSpan = 256;       // nearest-level table over ceil(2u), clipped to [-256, 256]
constexpr double kLutSteps[] = {0.9, 0.95, 1.0, 1.05, 1.1, 1.18};

struct LutRowFit {
  std::vector<double> d, amax, hw, hwv, cw, cwv;
  double cent[16];
  int8_t levels[16];
  float table[2 * kLutHalfSpan + 1];  // level value for ceil(2u)
  uint8_t index[2 * kLutHalfSpan + 1];

  void tabulate() {  // levels are integers: u > midpoint m exactly when ceil(2u) > 2m
    int k = 0;
    for (int t = -kLutHalfSpan; t <= kLutHalfSpan; ++t) {
      while (k < 15 && levels[k] + levels[k + 1] < t) ++k;
      index[t + kLutHalfSpan] = static_cast<uint8_t>(k);
      table[t + kLutHalfSpan] = levels[k];
    }
  }
  static int slot(float u2) {  // ceil(u2) clipped to the table, without a libm call (no SSE4.1 rounding here)
    const float c = std::clamp(u2, -static_cast<float>(kLutHalfSpan), static_cast<float>(kLutHalfSpan));
    const int t = static_cast<int>(c);  // towards zero
    return t + (c > static_cast<float>(t)) + kLutHalfSpan;
  }

  void fit_levels(const float* x, const float* wk, int64_t nb, bool warm) {
    hw.assign(kLutBins, 0.0), hwv.assign(kLutBins, 0.0);
    for (int64_t b = 0; b < nb; ++b) {
      const double db = d[b] > 0.0 ? d[b] : 1.0;
      const float inv = static_cast<float>(1.0 / db), dd = static_cast<float>(db * db);
      for (int k = 0; k < 32; ++k) {
        const float u = std::clamp(x[32 * b + k] * inv, -127.0f, 127.0f);
        const int bin = static_cast<int>(u * 2.0f + 254.5f);
        const float wt = wk[32 * b + k] * dd;
        hw[bin] += wt, hwv[bin] += wt * u;
      }
    }
    cw.assign(kLutBins + 1, 0.0), cwv.assign(kLutBins + 1, 0.0);
    for (int i = 0; i < kLutBins; ++i) cw[i + 1] = cw[i] + hw[i], cwv[i + 1] = cwv[i] + hwv[i];
    if (!warm) {  // weighted (2k + 1) / 32 quantiles
      for (int k = 0; k < 16; ++k) {
        const double target = cw[kLutBins] * (2 * k + 1) / 32.0;
        const int64_t pos = std::lower_bound(cw.begin(), cw.end(), target) - cw.begin() - 1;
        cent[k] = std::clamp<int64_t>(pos, 0, kLutBins - 1) * 0.5 - 127.0;
      }
    } else {
      for (int k = 0; k < 16; ++k) cent[k] = levels[k];
    }
    for (int iter = 0, n = warm ? kLutWarmIterations : kLutColdIterations; iter < n; ++iter) {
      double next[16], moved = 0.0;
      int lo = 0;
      for (int k = 0; k < 16; ++k) {
        // bins whose centre lies above the midpoint belong to the upper cluster
        const int hi = k < 15 ? std::clamp(static_cast<int>(std::floor((0.5 * (cent[k] + cent[k + 1]) + 127.0) * 2.0)) + 1,
                                           0, kLutBins)
                              : kLutBins;
        const double mass = cw[std::max(hi, lo)] - cw[lo];
        next[k] = mass > 0.0 ? (cwv[std::max(hi, lo)] - cwv[lo]) / mass : cent[k];
        lo = std::max(hi, lo);
      }
      std::sort(next, next + 16);
      for (int k = 0; k < 16; ++k) moved = std::max(moved, std::fabs(next[k] - cent[k])), cent[k] = next[k];
      if (moved <= kLutConverged) break;
    }
    double top = 0.0;
    for (double c : cent) top = std::max(top, std::fabs(c));
    for (int k = 0; k < 16; ++k)
      levels[k] = static_cast<int8_t>(std::clamp(std::nearbyint(top > 0.0 ? cent[k] * (127.0 / top) : 0.0), -127.0, 127.0));
    std::sort(levels, levels + 16);
    tabulate();
  }

  void fit_scales(const float* x, const float* w, int64_t nb) {
    for (int64_t b = 0; b < nb; ++b) {
      const float* xb = x + 32 * b;
      const float* wb = w + 32 * b;
      const double m = amax[b];
      if (m == 0.0) {
        d[b] = 0.0;
        continue;
      }
      double best_gain = -1.0, best_d = m / 127.0;
      float wx[32];
      for (int k = 0; k < 32; ++k) wx[k] = wb[k] * xb[k];
      auto candidate = [&](double inv) {
        const float inv2 = static_cast<float>(2.0 * inv);
        float sxl = 0.0f, sll = 0.0f;  // 32 terms: float sums are as close as the f32 weights
        for (int k = 0; k < 32; ++k) {
          const float l = table[slot(xb[k] * inv2)];
          sxl += wx[k] * l, sll += wb[k] * l * l;
        }
        const double dd = sll > 0.0f ? static_cast<double>(sxl) / sll : 0.0;
        const double gain = dd > 0.0 ? sxl * dd : 0.0;  // weighted error = sum w x^2 - gain
        if (gain > best_gain) best_gain = gain, best_d = std::max(dd, 0.0);
      };
      candidate(1.0 / (d[b] > 0.0 ? d[b] : m / 127.0));
      for (double step : kLutSteps) candidate(127.0 * step / m);
      d[b] = best_d;
    }
  }

  void fit(const float* x, int64_t cols, const float* w, const float* wk, uint8_t* out) {
    const int64_t nb = cols / 32;
    d.resize(static_cast<size_t>(nb)), amax.resize(static_cast<size_t>(nb));
    for (int64_t b = 0; b < nb; ++b) {
      float m = 0.0f;
      for (int k = 0; k < 32; ++k) m = std::max(m, std::fabs(x[32 * b + k]));
      amax[b] = m, d[b] = m / 127.0;
    }
    for (int round = 0; round < kLutRounds; ++round) {
      fit_levels(x, wk, nb, round > 0);
      fit_scales(x, w, nb);
    }
    double dmax = 0.0;
    for (double v : d) dmax = std::max(dmax, v);
    const float scale = dmax > 0.0 ? static_cast<float>(dmax / (255.0 * 255.0)) : 1.0f;
    std::memcpy(out, &scale, 4);
    std::memcpy(out + 4, levels, 16);
    uint8_t* blocks = out + 20;
    for (int64_t b = 0; b < nb; ++b, blocks += 17) {
      const double r = d[b] / scale;
      const double lo = std::clamp(std::floor(std::sqrt(r)), 0.0, 255.0), hi = std::min(lo + 1.0, 255.0);
      const int code = static_cast<int>(std::fabs(hi * hi - r) < std::fabs(r - lo * lo) ? hi : lo);
      const double db = static_cast<double>(scale) * code * code;
      const float inv2 = db > 0.0 ? static_cast<float>(2.0 / db) : 0.0f;
      blocks[0] = static_cast<uint8_t>(code);
      for (int j = 0; j < 16; ++j)
        blocks[1 + j] = static_cast<uint8_t>(index[slot(x[32 * b + j] * inv2)] |
                                             (index[slot(x[32 * b + j + 16] * inv2)] << 4));
    }
  }
};

void quantize_q4_lut(const float* x, int64_t cols, uint8_t* out) {
  thread_local LutRowFit fit;
  thread_local std::vector<float> ones;
  ones.assign(static_cast<size_t>(cols), 1.0f);
  fit.fit(x, cols, ones.data(), ones.data(), out);
}

}  // namespace

void quantize_q4_lut_rows(const float* x, int64_t rows, int64_t cols, const float* importance, uint8_t* out,
                          size_t out_size) {
  if (!x || !out) throw KernelError("quantize_q4_lut_rows: null buffer");
  if (rows < 0 || cols % 32) throw KernelError("quantize_q4_lut_rows: cols must be a multiple of 32");
  const size_t rb = row_bytes(Format::q4_lut, cols);
  if (out_size < rb * static_cast<size_t>(rows))
    throw KernelError("quantize_q4_lut_rows: output buffer holds " + std::to_string(out_size) + " bytes, need " +
                      std::to_string(rb * rows));
  std::vector<float> w(static_cast<size_t>(cols), 1.0f), wk(static_cast<size_t>(cols), 1.0f);
  if (importance)
    for (int64_t j = 0; j < cols; ++j)
      w[j] = importance[j], wk[j] = static_cast<float>(std::pow(std::max(importance[j], 0.0f), kLutPower));
  ThreadPool::global().run(rows, [&](int64_t r, int) {
    thread_local LutRowFit fit;
    fit.fit(x + r * cols, cols, w.data(), wk.data(), out + r * rb);
  });
}

bool can_quantize(Format f) {
  switch (f) {
    case Format::f32: case Format::f16: case Format::q8_0: case Format::q4_0: case Format::q4_1:
    case Format::q5_0: case Format::q4_lut: case Format::q3_k:
      return true;
    default:
      return false;
  }
}

void quantize_rows(const float* x, int64_t rows, int64_t cols, Format fmt, uint8_t* out, size_t out_size) {
  if (!x || !out) throw KernelError("quantize_rows: null buffer");
  if (rows < 0) throw KernelError("quantize_rows: rows must be >= 0");
  const size_t rb = row_bytes(fmt, cols);
  if (out_size < rb * static_cast<size_t>(rows))
    throw KernelError("quantize_rows: output buffer holds " + std::to_string(out_size) + " bytes, need " +
                      std::to_string(rb * rows));
  void (*fn)(const float*, int64_t, uint8_t*) = nullptr;
  switch (fmt) {
    case Format::q8_0: fn = quantize_q8_0; break;
    case Format::q4_0: fn = quantize_q4_0; break;
    case Format::q4_1: fn = quantize_q4_1; break;
    case Format::q5_0: fn = quantize_q5_0; break;
    case Format::q4_lut: fn = quantize_q4_lut; break;
    case Format::q3_k: fn = quantize_q3_k; break;
    case Format::f32:
      std::memcpy(out, x, rb * rows);
      return;
    case Format::f16:
      for (int64_t i = 0; i < rows * cols; ++i) store_fp16(out + 2 * i, x[i]);
      return;
    default:
      throw KernelError(std::string("quantize_rows: format ") + format_info(fmt).name +
                        " is read-only here (take K-quant weights from a GGUF file)");
  }
  ThreadPool::global().run(rows, [&](int64_t r, int) { fn(x + r * cols, cols, out + r * rb); });
}

}  // namespace ef
