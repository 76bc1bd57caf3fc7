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

bool prefers_int8_columns(Format fmt) {
  const Entry<ColumnsQ8Fn>& e = kernels().columns_q8[static_cast<int>(fmt)];
  return e.fn && std::string(e.isa) != "ref";
}

void matmul_columns(const WeightMatrix& w, const float* h, int64_t n, float* y, ColumnActs acts) {
  if (w.layout != Layout::rows) throw KernelError("matmul_columns: the matrix must be in the row layout");
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
