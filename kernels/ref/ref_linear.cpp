// Reference GEMM, dequantization and activation quantization: plain loops, double accumulators.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "kernel_table.h"
#include "ref_formats.h"

namespace ef::ref {
namespace {

template <Format F>
void gemm_q8(const RowsView& w, int64_t r0, int64_t r1, const Q8View& x, int64_t t0, int64_t t1, float* y,
             int64_t ldy) {
  const int64_t cols = w.cols;
  for (int64_t r = r0; r < r1; ++r) {
    for (int64_t t = t0; t < t1; ++t) {
      const int8_t* xq = x.q + t * cols;
      const float* xd = x.d + t * (cols / 32);
      const float* xs = x.s16 + t * (cols / 16);
      double acc = 0.0;
      int64_t ui = 0;
      for_each_unit(F, w.row(r), cols, [&](const Unit& u) {
        for (int h = 0; h < 2; ++h) {
          int64_t isum = 0;
          for (int k = 16 * h; k < 16 * h + 16; ++k) isum += static_cast<int64_t>(u.c[k]) * xq[32 * ui + k];
          acc += static_cast<double>(u.a[h]) * xd[ui] * static_cast<double>(isum) +
                 (static_cast<double>(u.b[h]) - static_cast<double>(u.o) * u.a[h]) * xs[2 * ui + h];
        }
        ++ui;
      });
      y[t * ldy + (r - r0)] = static_cast<float>(acc);
    }
  }
}

// The panel layout: each panel's rows copied back to the row layout, then the row kernel above.
template <Format F>
void gemm_q8_panels(const RowsView& w, int64_t r0, int64_t r1, const Q8View& x, int64_t t0, int64_t t1, float* y,
                    int64_t ldy) {
  const size_t rb = w.stride;
  std::vector<uint8_t> rows(16 * rb);
  for (int64_t p0 = r0; p0 < r1; p0 += 16) {
    const int64_t valid = std::min<int64_t>(16, r1 - p0);
    for (int i = 0; i < valid; ++i) panel_row(F, w.cols, w.panel(p0), i, rows.data() + i * rb);
    const RowsView rv{rows.data(), rb, nullptr, w.cols, valid};
    gemm_q8<F>(rv, 0, valid, x, t0, t1, y + (p0 - r0), ldy);
  }
}

template <Format F>
void gemm_f32(const RowsView& w, int64_t r0, int64_t r1, const float* x, int64_t t0, int64_t t1, float* y,
              int64_t ldy) {
  const int64_t cols = w.cols;
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* row = w.row(r);
    for (int64_t t = t0; t < t1; ++t) {
      const float* xt = x + t * cols;
      double acc = 0.0;
      for (int64_t c = 0; c < cols; ++c) {
        const float wv = F == Format::f32 ? load_f32(row + 4 * c) : load_fp16(row + 2 * c);
        acc += static_cast<double>(wv) * xt[c];
      }
      y[t * ldy + (r - r0)] = static_cast<float>(acc);
    }
  }
}

template <Format F>
void dequant(const uint8_t* row, int64_t cols, float* out) {
  if constexpr (F == Format::f32) {
    std::memcpy(out, row, static_cast<size_t>(cols) * 4);
  } else if constexpr (F == Format::f16) {
    for (int64_t c = 0; c < cols; ++c) out[c] = load_fp16(row + 2 * c);
  } else {
    for_each_unit(F, row, cols, [&](const Unit& u) {
      for (int k = 0; k < 32; ++k) {
        const int h = k / 16;
        const float q = static_cast<float>(u.c[k] - u.o);
        out[k] = u.b[h] == 0.0f ? u.a[h] * q : u.a[h] * q + u.b[h];
      }
      out += 32;
    });
  }
}

void quantize_acts(const float* x, int64_t cols, int8_t* q, float* d, float* s16, int32_t* sum16) {
  for (int64_t b = 0; b < cols / 32; ++b) {
    const float* xb = x + 32 * b;
    float amax = 0.0f;
    for (int k = 0; k < 32; ++k) amax = std::max(amax, std::fabs(xb[k]));
    const float id = amax > 0.0f ? 127.0f / amax : 0.0f;
    d[b] = amax / 127.0f;
    for (int h = 0; h < 2; ++h) {
      int sum = 0;
      for (int k = 16 * h; k < 16 * h + 16; ++k) {
        const int v = static_cast<int>(std::nearbyint(xb[k] * id));
        q[32 * b + k] = static_cast<int8_t>(std::clamp(v, -127, 127));
        sum += q[32 * b + k];
      }
      s16[2 * b + h] = d[b] * static_cast<float>(sum);
      sum16[2 * b + h] = sum;
    }
  }
}

template <Format F>
void ffn_down(const uint8_t* const* rows, const float* h, int64_t cnt, int64_t n_tok, int64_t dm, float* out, float*) {
  std::vector<float> row(static_cast<size_t>(dm));
  for (int64_t i = 0; i < cnt; ++i) {
    dequant<F>(rows[i], dm, row.data());
    for (int64_t t = 0; t < n_tok; ++t) {
      const float hv = h[t * cnt + i];
      if (hv == 0.0f) continue;
      for (int64_t k = 0; k < dm; ++k) out[t * dm + k] += hv * row[k];
    }
  }
}

// q8_0 down columns on int8 coefficients: the definition the SIMD levels reproduce bit for bit.
// Per token (and pass), output block b and group of kColumnGroup rows: g = h * the row's block
// scale, s = max|g| / 127, p = round-to-nearest-even(g / s) (q8x2: the residual fma(-s, p, g)
// quantized the same way), then out[32 b + j] = fma(float(sum_r p_r c_r[j]), s, out[32 b + j]),
// the passes in order within a group, the groups in order.
void columns_q8_0(const uint8_t* const* rows, const float* h, int64_t cnt, int64_t n_tok, int64_t dm, float* out,
                  float*, int passes) {
  const int64_t nb = dm / 32;
  for (int64_t t = 0; t < n_tok; ++t)
    for (int64_t i0 = 0; i0 < cnt; i0 += kColumnGroup) {
      const int64_t gn = std::min<int64_t>(kColumnGroup, cnt - i0);
      for (int64_t b = 0; b < nb; ++b) {
        float g[kColumnGroup];
        for (int64_t i = 0; i < gn; ++i) g[i] = h[t * cnt + i0 + i] * load_fp16(rows[i0 + i] + 34 * b);
        for (int pass = 0; pass < passes; ++pass) {
          float amax = 0.0f;
          for (int64_t i = 0; i < gn; ++i) amax = std::max(amax, std::fabs(g[i]));
          const float s = amax / 127.0f, id = s != 0.0f ? 1.0f / s : 0.0f;
          int32_t p[kColumnGroup];
          for (int64_t i = 0; i < gn; ++i) {
            p[i] = std::clamp(static_cast<int32_t>(std::nearbyint(g[i] * id)), -127, 127);
            g[i] = std::fma(-s, static_cast<float>(p[i]), g[i]);  // the residual, for the next pass
          }
          for (int j = 0; j < 32; ++j) {
            int32_t isum = 0;
            for (int64_t i = 0; i < gn; ++i) isum += p[i] * static_cast<int8_t>(rows[i0 + i][34 * b + 2 + j]);
            float& o = out[t * dm + 32 * b + j];
            o = std::fma(static_cast<float>(isum), s, o);
          }
        }
      }
    }
}

// Column panels (pack_columns): each group's rows copied back to q8_0 rows, then the product above.
void columns_q8_0_packed(const uint8_t* packed, int64_t rows, int64_t nb, int64_t b0, int64_t nbw, const float* h,
                         int64_t n_tok, float* out, float* scratch, int passes) {
  const size_t group_bytes = static_cast<size_t>(kColumnGroup) * nb * 34;
  std::vector<uint8_t> buf(static_cast<size_t>(rows) * nbw * 34);
  std::vector<const uint8_t*> ptrs(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) {
    const uint8_t* g = packed + static_cast<size_t>(r / kColumnGroup) * group_bytes;
    const int64_t i = r % kColumnGroup, k = i / 4, j = i % 4;
    uint8_t* row = buf.data() + static_cast<size_t>(r) * nbw * 34;
    for (int64_t b = 0; b < nbw; ++b) {
      std::memcpy(row + 34 * b, g + (i * nb + b0 + b) * 2, 2);
      const uint8_t* cb = g + 64 * nb + (b0 + b) * 1024 + 128 * k;
      for (int c = 0; c < 32; ++c) row[34 * b + 2 + c] = cb[4 * kColumnLane.v[c] + j];  // lane 16 + l: W1 at +64
    }
    ptrs[r] = row;
  }
  columns_q8_0(ptrs.data(), h, rows, n_tok, 32 * nbw, out, scratch, passes);
}

}  // namespace

void install_linear(KernelTable& t) {
  const char* n = "ref";
  t.gemm_q8[int(Format::q8_0)].set(gemm_q8<Format::q8_0>, n);
  t.gemm_q8[int(Format::q4_0)].set(gemm_q8<Format::q4_0>, n);
  t.gemm_q8[int(Format::q4_1)].set(gemm_q8<Format::q4_1>, n);
  t.gemm_q8[int(Format::q5_0)].set(gemm_q8<Format::q5_0>, n);
  t.gemm_q8[int(Format::q4_k)].set(gemm_q8<Format::q4_k>, n);
  t.gemm_q8[int(Format::q6_k)].set(gemm_q8<Format::q6_k>, n);
  t.gemm_q8[int(Format::q3_k)].set(gemm_q8<Format::q3_k>, n);
  t.gemm_q8[int(Format::q4_lut)].set(gemm_q8<Format::q4_lut>, n);
  t.gemm_q8_panels[int(Format::q8_0)].set(gemm_q8_panels<Format::q8_0>, n);
  t.gemm_q8_panels[int(Format::q4_0)].set(gemm_q8_panels<Format::q4_0>, n);
  t.gemm_q8_panels[int(Format::q4_1)].set(gemm_q8_panels<Format::q4_1>, n);
  t.gemm_q8_panels[int(Format::q5_0)].set(gemm_q8_panels<Format::q5_0>, n);
  t.gemm_q8_panels[int(Format::q4_k)].set(gemm_q8_panels<Format::q4_k>, n);
  t.gemm_q8_panels[int(Format::q6_k)].set(gemm_q8_panels<Format::q6_k>, n);
  t.gemm_q8_panels[int(Format::q3_k)].set(gemm_q8_panels<Format::q3_k>, n);
  t.gemm_q8_panels[int(Format::q4_lut)].set(gemm_q8_panels<Format::q4_lut>, n);
  t.gemm_f32[int(Format::f32)].set(gemm_f32<Format::f32>, n);
  t.gemm_f32[int(Format::f16)].set(gemm_f32<Format::f16>, n);
  t.dequant[int(Format::f32)].set(dequant<Format::f32>, n);
  t.dequant[int(Format::f16)].set(dequant<Format::f16>, n);
  t.dequant[int(Format::q8_0)].set(dequant<Format::q8_0>, n);
  t.dequant[int(Format::q4_0)].set(dequant<Format::q4_0>, n);
  t.dequant[int(Format::q4_1)].set(dequant<Format::q4_1>, n);
  t.dequant[int(Format::q5_0)].set(dequant<Format::q5_0>, n);
  t.dequant[int(Format::q4_k)].set(dequant<Format::q4_k>, n);
  t.dequant[int(Format::q6_k)].set(dequant<Format::q6_k>, n);
  t.dequant[int(Format::q3_k)].set(dequant<Format::q3_k>, n);
  t.dequant[int(Format::q4_lut)].set(dequant<Format::q4_lut>, n);
  t.quantize_acts.set(quantize_acts, n);
  t.ffn_down[int(Format::f32)].set(ffn_down<Format::f32>, n);
  t.ffn_down[int(Format::f16)].set(ffn_down<Format::f16>, n);
  t.ffn_down[int(Format::q8_0)].set(ffn_down<Format::q8_0>, n);
  t.ffn_down[int(Format::q4_0)].set(ffn_down<Format::q4_0>, n);
  t.ffn_down[int(Format::q4_1)].set(ffn_down<Format::q4_1>, n);
  t.ffn_down[int(Format::q5_0)].set(ffn_down<Format::q5_0>, n);
  t.ffn_down[int(Format::q4_k)].set(ffn_down<Format::q4_k>, n);
  t.ffn_down[int(Format::q6_k)].set(ffn_down<Format::q6_k>, n);
  t.ffn_down[int(Format::q3_k)].set(ffn_down<Format::q3_k>, n);
  t.ffn_down[int(Format::q4_lut)].set(ffn_down<Format::q4_lut>, n);
  t.columns_q8[int(Format::q8_0)].set(columns_q8_0, n);
  t.columns_q8_packed[int(Format::q8_0)].set(columns_q8_0_packed, n);
}

}  // namespace ef::ref
