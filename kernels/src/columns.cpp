// The product of activations with a matrix stored by columns: y[t, :] = sum_r h[t, r] * W[r, :],
// W's row r a quantized vector of `cols` values (a neuron's down column in a bundle's arena). It
// runs the sparse FFN's down step (ffn_down, every level with its twin) over all rows, split by
// output columns: each thread owns whole blocks of every row, so there are no partial sums to
// add, and each output is the same whatever the number of threads.
#include <algorithm>
#include <cstring>
#include <string>

#include "kernel_table.h"
#include "scratch.h"

namespace ef {

namespace {

void matmul_column_panels(const WeightMatrix& w, const float* h, int64_t n, float* y, ColumnActs acts) {
  if (w.fmt != Format::q8_0 || acts == ColumnActs::f32)
    throw KernelError("matmul_columns: column panels hold q8_0 columns for the int8 product (acts q8 or q8x2)");
  if (w.rows <= 0 || w.rows % kColumnGroup || n <= 0)
    throw KernelError("matmul_columns: column panels need rows a multiple of 32 and tokens > 0");
  check_cols(w.fmt, w.cols, "matmul_columns");
  if (!w.data || !h || !y) throw KernelError("matmul_columns: a buffer is null");
  if (w.size_bytes < static_cast<size_t>(w.rows) * row_bytes(w.fmt, w.cols))
    throw KernelError("matmul_columns: the weight buffer is smaller than its column panels");
  const ColumnsPackedFn fn = kernels().columns_q8_packed[int(w.fmt)].fn;
  const int passes = acts == ColumnActs::q8x2 ? 2 : 1;
  const int64_t nb = w.cols / 32, tasks = std::min<int64_t>(get_num_threads(), nb);
  ThreadPool::global().run(tasks, [&](int64_t task, int) {
    int64_t b0, b1;
    split_range(nb, tasks, task, &b0, &b1);
    const int64_t width = 32 * (b1 - b0);
    float* part = width == w.cols ? y : scratch_floats(static_cast<size_t>(n * width), 1);
    std::fill(part, part + n * width, 0.0f);
    fn(w.data, w.rows, nb, b0, b1 - b0, h, n, part, scratch_floats(columns_q8_scratch_floats(n, width, passes), 0), passes);
    if (part != y)
      for (int64_t t = 0; t < n; ++t)
        std::memcpy(y + t * w.cols + 32 * b0, part + t * width, static_cast<size_t>(width) * sizeof(float));
  });
}

}  // namespace

bool prefers_int8_columns(Format fmt) {
  const Entry<ColumnsQ8Fn>& e = kernels().columns_q8[static_cast<int>(fmt)];
  const Entry<ColumnsPackedFn>& p = kernels().columns_q8_packed[static_cast<int>(fmt)];
  return e.fn && p.fn && std::string(e.isa) != "ref" && std::string(p.isa) != "ref";
}

void pack_columns(const WeightMatrix& w, uint8_t* out, size_t out_size) {
  if (w.fmt != Format::q8_0 || w.layout != Layout::rows)
    throw KernelError("pack_columns: column panels are for q8_0 columns in the row layout");
  if (w.rows <= 0 || w.rows % kColumnGroup)
    throw KernelError("pack_columns: rows must be a positive multiple of 32, got " + std::to_string(w.rows));
  check_cols(w.fmt, w.cols, "pack_columns");
  const size_t rb = row_bytes(w.fmt, w.cols), stride = w.stride ? w.stride : rb;
  if (w.size_bytes < static_cast<size_t>(w.rows - 1) * stride + rb)
    throw KernelError("pack_columns: the weight buffer is smaller than its rows");
  if (!out || out_size < static_cast<size_t>(w.rows) * rb)
    throw KernelError("pack_columns: the output holds fewer bytes than the matrix");
  const int64_t nb = w.cols / 32;
  const size_t group_bytes = static_cast<size_t>(kColumnGroup) * rb;
  for (int64_t r = 0; r < w.rows; ++r) {
    const uint8_t* row = w.data + static_cast<size_t>(r) * stride;
    uint8_t* g = out + static_cast<size_t>(r / kColumnGroup) * group_bytes;
    const int64_t i = r % kColumnGroup, k = i / 4, j = i % 4;
    for (int64_t b = 0; b < nb; ++b) {
      std::memcpy(g + (i * nb + b) * 2, row + 34 * b, 2);
      uint8_t* cb = g + 64 * nb + b * 1024 + 128 * k;
      for (int c = 0; c < 32; ++c) cb[4 * kColumnLane.v[c] + j] = row[34 * b + 2 + c];
    }
  }
}

void matmul_columns(const WeightMatrix& w, const float* h, int64_t n, float* y, ColumnActs acts) {
  if (w.layout == Layout::panels) {
    matmul_column_panels(w, h, n, y, acts);
    return;
  }
  check_cols(w.fmt, w.cols, "matmul_columns");
  if (w.rows <= 0 || n <= 0) throw KernelError("matmul_columns: rows and tokens must be positive");
  if (!w.data || !h || !y) throw KernelError("matmul_columns: a buffer is null");
  const FormatInfo& fi = format_info(w.fmt);
  const size_t rb = row_bytes(w.fmt, w.cols), stride = w.stride ? w.stride : rb;
  if (w.size_bytes < static_cast<size_t>(w.rows - 1) * stride + rb)
    throw KernelError("matmul_columns: the weight buffer is smaller than its rows");
  const DownRowsFn down = kernels().ffn_down[int(w.fmt)].fn;
  const ColumnsQ8Fn int8 = acts == ColumnActs::f32 ? nullptr : kernels().columns_q8[int(w.fmt)].fn;
  if (acts != ColumnActs::f32 && !int8)
    throw KernelError(std::string("matmul_columns: no int8 product for ") + fi.name + " columns (use f32)");
  const int passes = acts == ColumnActs::q8x2 ? 2 : 1;
  // Column ranges are whole blocks (16 values at least, the down kernels' half-block sums); a row
  // header (q4_lut's levels) belongs to the whole row, so such rows are not split.
  const int64_t unit = std::max<int64_t>(fi.block_elems, 32);
  const int64_t units = fi.row_header ? 1 : w.cols / unit;
  const int64_t tasks = std::min<int64_t>(get_num_threads(), units);
  ThreadPool::global().run(tasks, [&](int64_t task, int) {
    int64_t u0, u1;
    split_range(units, tasks, task, &u0, &u1);
    const int64_t c0 = fi.row_header ? 0 : u0 * unit, width = fi.row_header ? w.cols : (u1 - u0) * unit;
    const size_t skip = fi.row_header ? 0 : static_cast<size_t>(c0 / fi.block_elems) * fi.block_bytes;
    thread_local std::vector<const uint8_t*> rows;
    rows.resize(static_cast<size_t>(w.rows));
    for (int64_t r = 0; r < w.rows; ++r) rows[r] = w.data + static_cast<size_t>(r) * stride + skip;
    float* part = y;
    if (width != w.cols) part = scratch_floats(static_cast<size_t>(n * width), 1);
    std::fill(part, part + n * width, 0.0f);
    if (int8) {
      int8(rows.data(), h, w.rows, n, width, part, scratch_floats(columns_q8_scratch_floats(n, width, passes), 0), passes);
    } else {
      down(rows.data(), h, w.rows, n, width, part, scratch_floats(down_scratch_floats(n, width), 0));
    }
    if (part != y)
      for (int64_t t = 0; t < n; ++t)
        std::memcpy(y + t * w.cols + c0, part + t * width, static_cast<size_t>(width) * sizeof(float));
  });
}

}  // namespace ef
