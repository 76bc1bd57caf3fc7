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

// q4_lut per row (docs/weight-formats.md): 16 int8 levels, f32 scale s, per block of 32 a code k
// with block scale s * k^2. Levels = 16 centroids of a 1-D k-means over the block-normalized
// values (x / (max|block| / 127), each weighted by its block scale squared: its share of the
// error in x), snapped to int8 with the largest at 127; each block's scale is the least-squares
// one of the best of a few candidates, then rounded to s * k^2. The exporter's weighted fit
// (edgeflash.export.quant.q4_lut) does the same with importance weights and a second round.
void quantize_q4_lut(const float* x, int64_t cols, uint8_t* out) {
  const int64_t nb = cols / 32;
  std::vector<double> a(static_cast<size_t>(nb)), amaxes(static_cast<size_t>(nb));
  std::vector<std::pair<double, double>> vw(static_cast<size_t>(cols));  // (normalized value, weight)
  for (int64_t b = 0; b < nb; ++b) {
    float m = 0.0f;
    for (int k = 0; k < 32; ++k) m = std::max(m, std::fabs(x[32 * b + k]));
    amaxes[b] = m;
    a[b] = m > 0.0f ? m / 127.0 : 1.0;
    for (int k = 0; k < 32; ++k) vw[32 * b + k] = {x[32 * b + k] / a[b], a[b] * a[b]};
  }
  std::sort(vw.begin(), vw.end());
  std::vector<double> cw(vw.size() + 1, 0.0), cwv(vw.size() + 1, 0.0);
  for (size_t i = 0; i < vw.size(); ++i) {
    cw[i + 1] = cw[i] + vw[i].second;
    cwv[i + 1] = cwv[i] + vw[i].second * vw[i].first;
  }
  double cent[16];
  for (int k = 0; k < 16; ++k) {  // weighted (2k + 1) / 32 quantiles
    const double target = cw.back() * (2 * k + 1) / 32.0;
    const size_t pos = static_cast<size_t>(std::lower_bound(cw.begin() + 1, cw.end(), target) - cw.begin() - 1);
    cent[k] = vw[std::min(pos, vw.size() - 1)].first;
  }
  for (int iter = 0; iter < 20; ++iter) {
    size_t begin = 0;
    bool moved = false;
    for (int k = 0; k < 16; ++k) {
      size_t end = vw.size();
      if (k < 15) {
        const double boundary = 0.5 * (cent[k] + cent[k + 1]);
        end = static_cast<size_t>(std::upper_bound(vw.begin() + begin, vw.end(), std::make_pair(boundary, 1e300)) -
                                  vw.begin());
      }
      if (cw[end] > cw[begin]) {
        const double mean = (cwv[end] - cwv[begin]) / (cw[end] - cw[begin]);
        moved |= std::fabs(mean - cent[k]) > 0.02;
        cent[k] = mean;
      }
      begin = end;
    }
    if (!moved) break;
  }
  double top = 0.0;
  for (double c : cent) top = std::max(top, std::fabs(c));
  int8_t levels[16];
  for (int k = 0; k < 16; ++k)
    levels[k] = static_cast<int8_t>(std::clamp(std::lround(top > 0 ? cent[k] * 127.0 / top : 0.0), -127L, 127L));
  std::sort(levels, levels + 16);
  auto nearest = [&](double val) {
    int best = 0;
    double err = std::fabs(val - levels[0]);
    for (int k = 1; k < 16; ++k) {
      const double e = std::fabs(val - levels[k]);
      if (e < err) err = e, best = k;
    }
    return best;
  };
  static const double kSteps[] = {0.9, 0.95, 1.0, 1.05, 1.1, 1.18};
  std::vector<double> d(static_cast<size_t>(nb), 0.0);
  double dmax = 0.0;
  for (int64_t b = 0; b < nb; ++b) {
    const float* xb = x + 32 * b;
    const double amax = amaxes[b];
    if (amax == 0.0) continue;
    double best_gain = -1.0;
    for (double step : kSteps) {
      const double cand = amax / (127.0 * step);
      double sxl = 0.0, sll = 0.0;
      for (int k = 0; k < 32; ++k) {
        const double l = levels[nearest(xb[k] / cand)];
        sxl += xb[k] * l, sll += l * l;
      }
      const double dd = sll > 0.0 ? sxl / sll : 0.0;
      const double gain = dd > 0.0 ? sxl * dd : 0.0;
      if (gain > best_gain) best_gain = gain, d[b] = std::max(dd, 0.0);
    }
    dmax = std::max(dmax, d[b]);
  }
  const float scale = dmax > 0.0 ? static_cast<float>(dmax / (255.0 * 255.0)) : 1.0f;
  std::memcpy(out, &scale, 4);
  std::memcpy(out + 4, levels, 16);
  uint8_t* blocks = out + 20;
  for (int64_t b = 0; b < nb; ++b, blocks += 17) {
    const double r = d[b] / scale;
    const double lo = std::clamp(std::floor(std::sqrt(r)), 0.0, 255.0), hi = std::min(lo + 1.0, 255.0);
    const int code = static_cast<int>(std::fabs(hi * hi - r) < std::fabs(r - lo * lo) ? hi : lo);
    const float fc = static_cast<float>(code), db = scale * (fc * fc);
    blocks[0] = static_cast<uint8_t>(code);
    for (int j = 0; j < 16; ++j) {
      const int lo_i = db > 0.0f ? nearest(x[32 * b + j] / db) : 0;
      const int hi_i = db > 0.0f ? nearest(x[32 * b + j + 16] / db) : 0;
      blocks[1 + j] = static_cast<uint8_t>(lo_i | (hi_i << 4));
    }
  }
}

}  // namespace

bool can_quantize(Format f) {
  switch (f) {
    case Format::f32: case Format::f16: case Format::q8_0: case Format::q4_0: case Format::q4_1:
    case Format::q5_0: case Format::q4_lut:
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
