// GEMV / small-batch GEMM entry points: argument checks, activation quantization, and the split
// of rows over the thread pool. The arithmetic lives in the per-ISA kernels of the table.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <string>

#include "kernel_table.h"
#include "scratch.h"

namespace ef {
namespace {

void check_weights(const WeightMatrix& w, const char* what) {
  if (!w.data) throw KernelError(std::string(what) + ": weight buffer is null");
  if (!runs_format(w.fmt))
    throw KernelError(std::string(what) + ": no kernel runs format " + format_info(w.fmt).name +
                      " (convert it to q8_0 or f16 first)");
  if (w.rows <= 0) throw KernelError(std::string(what) + ": weight rows must be positive, got " + std::to_string(w.rows));
  check_cols(w.fmt, w.cols, what);
  const size_t rb = row_bytes(w.fmt, w.cols);
  if (w.layout == Layout::panels) {
    if (!has_panels(w.fmt))
      throw KernelError(std::string(what) + ": format " + format_info(w.fmt).name + " has no panel layout");
    if (w.stride) throw KernelError(std::string(what) + ": a panel-layout matrix has no row stride");
    const size_t need = panel_bytes(w.fmt, w.rows, w.cols);
    if (w.size_bytes < need)
      throw KernelError(std::string(what) + ": weight buffer holds " + std::to_string(w.size_bytes) + " bytes, " +
                        std::to_string(w.rows) + " rows of " + format_info(w.fmt).name + " in panels need " +
                        std::to_string(need));
    return;
  }
  const size_t stride = w.stride ? w.stride : rb;
  if (stride < rb)
    throw KernelError(std::string(what) + ": row stride " + std::to_string(stride) + " is below the row size " +
                      std::to_string(rb));
  const size_t need = static_cast<size_t>(w.rows - 1) * stride + rb;
  if (w.size_bytes < need)
    throw KernelError(std::string(what) + ": weight buffer holds " + std::to_string(w.size_bytes) + " bytes, " +
                      std::to_string(w.rows) + " rows of " + format_info(w.fmt).name + " need " + std::to_string(need));
}

RowsView view_of(const WeightMatrix& w, const int32_t* index) {
  const size_t rb = row_bytes(w.fmt, w.cols);
  return RowsView{w.data, w.stride ? w.stride : rb, index, w.cols, w.rows};
}

// Row r of a matrix in the row layout: in place, or copied out of its panel into `tmp`.
const uint8_t* row_of(const RowsView& v, Layout layout, Format fmt, int64_t r, uint8_t* tmp) {
  if (layout == Layout::rows) return v.row(r);
  panel_row(fmt, v.cols, v.panel(r), static_cast<int>(r % kPanelRows), tmp);
  return tmp;
}

// Row chunk per task: enough tasks to balance the threads, few enough that claiming is cheap;
// with many tokens, small enough that a chunk of weights stays in L1/L2 across token tiles.
// Chunks are whole 16-row panels (the AVX-512 GEMM's unit of work; the results of a row never
// depend on the chunking, only the speed does).
int64_t rows_per_task(int64_t rows, int64_t n_tok, size_t row_bytes_) {
  constexpr int64_t kPanel = 16;
  const int64_t threads = get_num_threads();
  int64_t chunk = threads == 1 ? rows : std::max<int64_t>(8, (rows + 4 * threads - 1) / (4 * threads));
  if (n_tok > 4) chunk = std::min<int64_t>(chunk, std::max<int64_t>(4, (24 << 10) / static_cast<int64_t>(row_bytes_)));
  // Prefill-sized batches: one panel per task, so two threads split the panels evenly. Up to 16
  // tokens (a verification pass) a task still waits on DRAM, and only a run of panels lets its
  // prefetch run ahead of the panel it computes (Qwen2.5-Coder-1.5B, 9 tokens: 73 ms a pass, 106
  // ms with a panel per task).
  if (n_tok > 16 && threads > 1) chunk = kPanel;
  chunk = (chunk + kPanel - 1) / kPanel * kPanel;
  return std::max<int64_t>(1, std::min(chunk, rows));
}

void run_gemm_q8(const RowsView& v, Layout layout, int64_t rows, size_t rb, Format fmt, const QuantizedActs& xq,
                 float* y) {
  const GemmQ8Fn fn = layout == Layout::panels ? kernels().gemm_q8_panels[int(fmt)].fn : kernels().gemm_q8[int(fmt)].fn;
  const Q8View xv = q8_view(xq);
  const int64_t n = xq.n(), chunk = rows_per_task(rows, n, rb);
  const int64_t tasks = (rows + chunk - 1) / chunk;
  ThreadPool::global().run(tasks, [&](int64_t task, int) {
    const int64_t r0 = task * chunk, r1 = std::min(rows, r0 + chunk);
    fn(v, r0, r1, xv, 0, n, y + r0, rows);
  });
}

constexpr int kMaxMulti = 8;

void run_gemm_q8_multi(const WeightMatrix* ws, float* const* ys, int count, const QuantizedActs& xq) {
  const Q8View xv = q8_view(xq);
  const int64_t n = xq.n();
  // Tasks of about equal bytes over all the matrices: the first tasks are the first matrix's rows.
  size_t total = 0;
  for (int i = 0; i < count; ++i) total += static_cast<size_t>(ws[i].rows) * row_bytes(ws[i].fmt, ws[i].cols);
  const int64_t threads = get_num_threads();
  GemmQ8Fn fn[kMaxMulti];
  RowsView view[kMaxMulti];
  int64_t chunk[kMaxMulti], first_task[kMaxMulti + 1];
  first_task[0] = 0;
  for (int i = 0; i < count; ++i) {
    const size_t rb = row_bytes(ws[i].fmt, ws[i].cols);
    fn[i] = ws[i].layout == Layout::panels ? kernels().gemm_q8_panels[int(ws[i].fmt)].fn
                                           : kernels().gemm_q8[int(ws[i].fmt)].fn;
    view[i] = view_of(ws[i], nullptr);
    const int64_t rows = ws[i].rows;
    int64_t c = rows_per_task(rows, n, rb);
    if (n <= 16 && threads > 1) {  // GEMV and verification: chunks of about total / (4 threads) bytes, whole panels
      const size_t target = std::max<size_t>(total / static_cast<size_t>(4 * threads), 16 * rb);
      c = std::min<int64_t>(rows, static_cast<int64_t>(target / rb) / 16 * 16);
    }
    chunk[i] = std::max<int64_t>(1, c);
    first_task[i + 1] = first_task[i] + (rows + chunk[i] - 1) / chunk[i];
  }
  ThreadPool::global().run(first_task[count], [&](int64_t task, int) {
    int i = 0;
    while (task >= first_task[i + 1]) ++i;
    const int64_t rows = ws[i].rows, r0 = (task - first_task[i]) * chunk[i], r1 = std::min(rows, r0 + chunk[i]);
    fn[i](view[i], r0, r1, xv, 0, n, ys[i] + r0, rows);
  });
}

void run_gemm_f32(const RowsView& v, int64_t rows, size_t rb, Format fmt, const float* x, int64_t n, float* y) {
  const GemmF32Fn fn = kernels().gemm_f32[int(fmt)].fn;
  const int64_t chunk = rows_per_task(rows, n, rb);
  const int64_t tasks = (rows + chunk - 1) / chunk;
  ThreadPool::global().run(tasks, [&](int64_t task, int) {
    const int64_t r0 = task * chunk, r1 = std::min(rows, r0 + chunk);
    fn(v, r0, r1, x, 0, n, y + r0, rows);
  });
}

// Quantized weights with f32 activations: dequantize a chunk of rows, then the f32 kernel.
void run_gemm_dequant(const RowsView& v, Layout layout, int64_t rows, size_t rb, Format fmt, const float* x, int64_t n,
                      float* y) {
  const KernelTable& t = kernels();
  const DequantRowFn dq = t.dequant[int(fmt)].fn;
  const GemmF32Fn fn = t.gemm_f32[int(Format::f32)].fn;
  const int64_t cols = v.cols;
  const int64_t chunk = std::min<int64_t>(rows_per_task(rows, n, rb), std::max<int64_t>(1, (64 << 10) / (4 * cols)));
  const int64_t tasks = (rows + chunk - 1) / chunk;
  ThreadPool::global().run(tasks, [&](int64_t task, int) {
    const int64_t r0 = task * chunk, r1 = std::min(rows, r0 + chunk);
    float* buf = scratch_floats(static_cast<size_t>(chunk * cols));
    uint8_t* tmp = layout == Layout::panels ? reinterpret_cast<uint8_t*>(scratch_floats(rb / 4 + 1, 1)) : nullptr;
    for (int64_t r = r0; r < r1; ++r) dq(row_of(v, layout, fmt, r, tmp), cols, buf + (r - r0) * cols);
    const RowsView fv{reinterpret_cast<const uint8_t*>(buf), static_cast<size_t>(cols) * 4, nullptr, cols};
    fn(fv, 0, r1 - r0, x, 0, n, y + r0, rows);
  });
}

void matmul_impl(const WeightMatrix& w, const int32_t* index, int64_t out_rows, const float* x, int64_t n, float* y,
                 ActPrecision prec) {
  if (!x || !y) throw KernelError("matmul: activation or output buffer is null");
  if (n <= 0) throw KernelError("matmul: the number of activation rows must be positive, got " + std::to_string(n));
  const RowsView v = view_of(w, index);
  const size_t rb = row_bytes(w.fmt, w.cols);
  if (!format_info(w.fmt).quantized) {
    run_gemm_f32(v, out_rows, rb, w.fmt, x, n, y);
  } else if (prec == ActPrecision::f32) {
    run_gemm_dequant(v, w.layout, out_rows, rb, w.fmt, x, n, y);
  } else {
    thread_local QuantizedActs xq;
    xq.quantize(x, n, w.cols);
    run_gemm_q8(v, w.layout, out_rows, rb, w.fmt, xq, y);
  }
}

void check_row_ids(const int32_t* rows, int64_t n_rows, int64_t limit, const char* what) {
  if (n_rows <= 0) throw KernelError(std::string(what) + ": the row list is empty");
  if (!rows) throw KernelError(std::string(what) + ": the row list is null");
  for (int64_t i = 0; i < n_rows; ++i)
    if (rows[i] < 0 || rows[i] >= limit)
      throw KernelError(std::string(what) + ": row index " + std::to_string(rows[i]) + " at position " +
                        std::to_string(i) + " is outside [0, " + std::to_string(limit) + ")");
}

}  // namespace

size_t QuantizedActs::bytes_for(int64_t n, int64_t cols) {
  const size_t e = static_cast<size_t>(n * cols);
  // codes, then per 32: d, ns32, s32; per 16: s16, ns16; d8 is d repeated 8 times per block
  return e * sizeof(int8_t) + e / 32 * (sizeof(float) + sizeof(int32_t) + sizeof(float)) +
         e / 16 * (sizeof(float) + sizeof(int32_t)) + e / 4 * sizeof(float);
}

void QuantizedActs::quantize(const float* x, int64_t n, int64_t cols) {
  if (!x) throw KernelError("quantize activations: input is null");
  if (n <= 0) throw KernelError("quantize activations: the number of rows must be positive");
  if (cols <= 0 || cols % 32) throw KernelError("quantize activations: columns must be a positive multiple of 32, got " + std::to_string(cols));
  n_ = n;
  cols_ = cols;
  if (q_.size() < static_cast<size_t>(n * cols)) q_.resize(static_cast<size_t>(n * cols));
  if (d_.size() < static_cast<size_t>(n * cols / 32)) d_.resize(static_cast<size_t>(n * cols / 32));
  if (s16_.size() < static_cast<size_t>(n * cols / 16)) s16_.resize(static_cast<size_t>(n * cols / 16));
  if (d8_.size() < static_cast<size_t>(n * cols / 4)) d8_.resize(static_cast<size_t>(n * cols / 4));
  if (ns16_.size() < static_cast<size_t>(n * cols / 16)) ns16_.resize(static_cast<size_t>(n * cols / 16));
  if (ns32_.size() < static_cast<size_t>(n * cols / 32)) ns32_.resize(static_cast<size_t>(n * cols / 32));
  if (s32_.size() < static_cast<size_t>(n * cols / 32)) s32_.resize(static_cast<size_t>(n * cols / 32));
  const QuantizeActsFn fn = kernels().quantize_acts.fn;
  auto one = [&](int64_t t, int) {
    const int64_t nb = cols / 32;
    int32_t* ns16 = ns16_.data() + t * 2 * nb;  // the kernel writes the half sums; stored negated below
    fn(x + t * cols, cols, q_.data() + t * cols, d_.data() + t * nb, s16_.data() + t * 2 * nb, ns16);
    float* d8 = d8_.data() + t * 8 * nb;
    const float* d = d_.data() + t * nb;
    int32_t* ns32 = ns32_.data() + t * nb;
    float* s32 = s32_.data() + t * nb;
    for (int64_t u = 0; u < nb; ++u) {
      for (int k = 0; k < 8; ++k) d8[8 * u + k] = d[u];
      const int32_t sum = ns16[2 * u] + ns16[2 * u + 1];
      ns16[2 * u] = -ns16[2 * u];
      ns16[2 * u + 1] = -ns16[2 * u + 1];
      ns32[u] = -sum;
      s32[u] = d[u] * static_cast<float>(sum);
    }
  };
  if (n * cols < (1 << 15)) {
    for (int64_t t = 0; t < n; ++t) one(t, 0);
  } else {
    ThreadPool::global().run(n, one);
  }
}

void matmul(const WeightMatrix& w, const float* x, int64_t n, float* y, ActPrecision prec) {
  check_weights(w, "matmul");
  matmul_impl(w, nullptr, w.rows, x, n, y, prec);
}

void matmul(const WeightMatrix& w, const QuantizedActs& xq, float* y) {
  check_weights(w, "matmul");
  if (!y) throw KernelError("matmul: output buffer is null");
  if (!format_info(w.fmt).quantized)
    throw KernelError(std::string("matmul: Q8 activations need a quantized weight format, got ") + format_info(w.fmt).name);
  if (xq.n() <= 0 || xq.cols() != w.cols)
    throw KernelError("matmul: quantized activations have " + std::to_string(xq.cols()) + " columns, weights have " +
                      std::to_string(w.cols));
  run_gemm_q8(view_of(w, nullptr), w.layout, w.rows, row_bytes(w.fmt, w.cols), w.fmt, xq, y);
}

void matmul_multi(const WeightMatrix* ws, float* const* ys, int count, const QuantizedActs& xq) {
  if (count < 1 || count > kMaxMulti)
    throw KernelError("matmul_multi: 1.." + std::to_string(kMaxMulti) + " matrices, got " + std::to_string(count));
  if (!ws || !ys) throw KernelError("matmul_multi: matrix or output list is null");
  for (int i = 0; i < count; ++i) {
    check_weights(ws[i], "matmul_multi");
    if (!ys[i]) throw KernelError("matmul_multi: output buffer is null");
    if (!format_info(ws[i].fmt).quantized)
      throw KernelError(std::string("matmul_multi: Q8 activations need quantized weights, got ") +
                        format_info(ws[i].fmt).name);
    if (xq.n() <= 0 || xq.cols() != ws[i].cols)
      throw KernelError("matmul_multi: quantized activations have " + std::to_string(xq.cols()) +
                        " columns, matrix " + std::to_string(i) + " has " + std::to_string(ws[i].cols));
  }
  run_gemm_q8_multi(ws, ys, count, xq);
}

void matmul_rows(const WeightMatrix& w, const int32_t* rows, int64_t n_rows, const float* x, int64_t n, float* y,
                 ActPrecision prec) {
  check_weights(w, "matmul_rows");
  if (w.layout != Layout::rows) throw KernelError("matmul_rows: listed rows need the row layout, not panels");
  check_row_ids(rows, n_rows, w.rows, "matmul_rows");
  matmul_impl(w, rows, n_rows, x, n, y, prec);
}

void dequantize_rows(const WeightMatrix& w, const int32_t* rows, int64_t n_rows, float* out) {
  check_weights(w, "dequantize");
  if (!out) throw KernelError("dequantize: output buffer is null");
  if (rows) {
    check_row_ids(rows, n_rows, w.rows, "dequantize");
  } else if (n_rows != w.rows) {
    throw KernelError("dequantize: without a row list all " + std::to_string(w.rows) + " rows are written");
  }
  const RowsView v = view_of(w, nullptr);
  const DequantRowFn fn = kernels().dequant[int(w.fmt)].fn;
  const int64_t cols = w.cols;
  const size_t rb = row_bytes(w.fmt, cols);
  const int64_t chunk = std::max<int64_t>(1, (256 << 10) / (cols * 4));
  ThreadPool::global().run((n_rows + chunk - 1) / chunk, [&](int64_t task, int) {
    const int64_t r1 = std::min(n_rows, (task + 1) * chunk);
    uint8_t* tmp = w.layout == Layout::panels ? reinterpret_cast<uint8_t*>(scratch_floats(rb / 4 + 1, 1)) : nullptr;
    for (int64_t r = task * chunk; r < r1; ++r)
      fn(row_of(v, w.layout, w.fmt, rows ? rows[r] : r, tmp), cols, out + r * cols);
  });
}

double timed_read(const uint8_t* data, size_t bytes) {
  if (!data || bytes < 4096) throw KernelError("timed_read: need a buffer of at least 4096 bytes");
  const int64_t threads = get_num_threads();
  const size_t chunk = (bytes / threads) & ~static_cast<size_t>(63);
  std::atomic<uint64_t> sink{0};
  const auto t0 = std::chrono::steady_clock::now();
  ThreadPool::global().run(threads, [&](int64_t task, int) {
    const uint64_t* p = reinterpret_cast<const uint64_t*>(data + task * chunk);
    const size_t words = chunk / 8;
    uint64_t a0 = 0, a1 = 0, a2 = 0, a3 = 0, a4 = 0, a5 = 0, a6 = 0, a7 = 0;
    for (size_t i = 0; i + 8 <= words; i += 8) {
      __builtin_prefetch(p + i + 256);  // 2 KiB ahead, like the streaming GEMV
      a0 += p[i], a1 += p[i + 1], a2 += p[i + 2], a3 += p[i + 3];
      a4 += p[i + 4], a5 += p[i + 5], a6 += p[i + 6], a7 += p[i + 7];
    }
    sink.fetch_xor(a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7);
  });
  const auto t1 = std::chrono::steady_clock::now();
  return std::chrono::duration<double>(t1 - t0).count();
}

}  // namespace ef
