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

// Per row: levels = 16 k-means centroids of x / scale (scale = max|x| / 127), snapped to int8.
// 1-D k-means on the sorted values: every cluster is a contiguous run, so Lloyd steps are cheap.
void quantize_q4_lut(const float* x, int64_t cols, uint8_t* out) {
  float amax = 0.0f;
  for (int64_t i = 0; i < cols; ++i) amax = std::max(amax, std::fabs(x[i]));
  const float scale = amax > 0.0f ? amax / 127.0f : 1.0f;
  std::vector<float> v(static_cast<size_t>(cols));
  for (int64_t i = 0; i < cols; ++i) v[i] = x[i] / scale;
  std::vector<float> sorted(v);
  std::sort(sorted.begin(), sorted.end());
  std::vector<double> prefix(sorted.size() + 1, 0.0);
  for (size_t i = 0; i < sorted.size(); ++i) prefix[i + 1] = prefix[i] + sorted[i];
  double cent[16];
  for (int k = 0; k < 16; ++k) cent[k] = sorted[static_cast<size_t>((2 * k + 1) * cols / 32)];
  for (int iter = 0; iter < 30; ++iter) {
    size_t begin = 0;
    bool moved = false;
    for (int k = 0; k < 16; ++k) {
      size_t end = sorted.size();
      if (k < 15) {
        const double boundary = 0.5 * (cent[k] + cent[k + 1]);
        end = static_cast<size_t>(std::upper_bound(sorted.begin() + begin, sorted.end(), boundary) - sorted.begin());
      }
      if (end > begin) {
        const double mean = (prefix[end] - prefix[begin]) / static_cast<double>(end - begin);
        moved |= std::fabs(mean - cent[k]) > 1e-4;
        cent[k] = mean;
      }
      begin = end;
    }
    if (!moved) break;
  }
  int8_t levels[16];
  for (int k = 0; k < 16; ++k) levels[k] = static_cast<int8_t>(std::clamp(std::lround(cent[k]), -127L, 127L));
  std::memcpy(out, &scale, 4);
  std::memcpy(out + 4, levels, 16);
  std::memset(out + 20, 0, 12);
  uint8_t* blocks = out + 32;
  auto nearest = [&](float val) {
    int best = 0;
    float err = std::fabs(val - levels[0]);
    for (int k = 1; k < 16; ++k) {
      const float e = std::fabs(val - levels[k]);
      if (e < err) err = e, best = k;
    }
    return best;
  };
  for (int64_t b = 0; b < cols / 32; ++b) {
    for (int j = 0; j < 16; ++j) {
      const int lo = nearest(v[32 * b + j]), hi = nearest(v[32 * b + j + 16]);
      blocks[16 * b + j] = static_cast<uint8_t>(lo | (hi << 4));
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
