// The panel layout (kernels.h, docs/weight-formats.md): 16 rows interleaved field by field, so a
// SIMD GEMV reads a panel as one sequential stream of ready-made registers (lane i = row i).
#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "kernel_table.h"

namespace ef {
namespace {

inline int field_slot(const Field& fd, int i) { return fd.quad ? 4 * (i % 4) + i / 4 : i; }

void check_panel_matrix(const WeightMatrix& w, const char* what) {
  if (!has_panels(w.fmt))
    throw KernelError(std::string(what) + ": format " + format_info(w.fmt).name + " has no panel layout");
  if (w.rows <= 0) throw KernelError(std::string(what) + ": rows must be positive");
  check_cols(w.fmt, w.cols, what);
}

// Copies the fields of one block (or header) of row i between the two layouts: pb is its column
// in the panel, rb its bytes in the row; to_panel = row -> panel slot, else back.
void move_fields(const Field* fields, int count, uint8_t* pb, int i, uint8_t* rb, bool to_panel) {
  for (int k = 0; k < count; ++k) {
    const Field& fd = fields[k];
    for (int l = 0; l < fd.size / fd.lane; ++l) {
      uint8_t* p = pb + kPanelRows * fd.offset + (kPanelRows * l + field_slot(fd, i)) * fd.lane;
      uint8_t* r = rb + fd.offset + l * fd.lane;
      if (to_panel) {
        std::memcpy(p, r, fd.lane);
      } else {
        std::memcpy(r, p, fd.lane);
      }
    }
  }
}

// Copies one row between the two layouts: to_panel = row -> panel slot, else back.
void move_row(Format f, int64_t cols, uint8_t* panel, int i, uint8_t* row, bool to_panel) {
  const FormatInfo& info = format_info(f);
  const PanelFields pf = panel_fields(f);
  const int64_t nb = cols / info.block_elems;
  const int bb = info.block_bytes, header = info.row_header;
  move_fields(pf.h, pf.header_count, panel, i, row, to_panel);
  for (int64_t b = 0; b < nb; ++b)
    move_fields(pf.f, pf.count, panel + kPanelRows * (header + b * bb), i, row + header + b * bb, to_panel);
}

}  // namespace

PanelFields panel_fields(Format f) {
  switch (f) {
    // header: scale (f32), levels (16 bytes); block: k (1 byte), 16 nibble bytes
    case Format::q4_lut: return {2, {{0, 1, 1}, {1, 16, 16, true}}, 2, {{0, 4, 4}, {4, 16, 16, true}}};
    case Format::q8_0: return {2, {{0, 2, 2}, {2, 32, 4}}};                    // d, qs
    case Format::q4_0: return {2, {{0, 2, 2}, {2, 16, 4}}};                    // d, qs
    case Format::q4_1: return {3, {{0, 2, 2}, {2, 2, 2}, {4, 16, 4}}};         // d, m, qs
    case Format::q5_0: return {3, {{0, 2, 2}, {2, 4, 4}, {6, 16, 4}}};         // d, qh, qs
    case Format::q4_k: return {1, {{0, 144, 4}}};                              // d|dmin, scales, qs: all words
    case Format::q6_k: return {2, {{0, 208, 4}, {208, 2, 2}}};                 // ql, qh, scales; d
    case Format::q3_k: return {2, {{0, 108, 4}, {108, 2, 2}}};                 // hmask, qs, scales; d
    default: return {0, {}};
  }
}

bool has_panels(Format f) { return panel_fields(f).count > 0; }

bool prefers_panels(Format f) {
  if (!has_panels(f)) return false;
  const Entry<GemmQ8Fn>& e = kernels().gemm_q8_panels[static_cast<int>(f)];
  return e.fn && std::string(e.isa) != "ref";
}

size_t panel_bytes(Format f, int64_t rows, int64_t cols) {
  if (rows <= 0) throw KernelError("panel_bytes: rows must be positive");
  const int64_t panels = (rows + kPanelRows - 1) / kPanelRows;
  return static_cast<size_t>(panels * kPanelRows) * row_bytes(f, cols);
}

void pack_panels(const WeightMatrix& w, uint8_t* out, size_t out_size) {
  check_panel_matrix(w, "pack_panels");
  if (w.layout != Layout::rows) throw KernelError("pack_panels: the matrix is already in panels");
  const size_t rb = row_bytes(w.fmt, w.cols), stride = w.stride ? w.stride : rb;
  if (!w.data || w.size_bytes < static_cast<size_t>(w.rows - 1) * stride + rb)
    throw KernelError("pack_panels: the weight buffer is smaller than its rows");
  const size_t need = panel_bytes(w.fmt, w.rows, w.cols);
  if (!out || out_size < need)
    throw KernelError("pack_panels: output holds " + std::to_string(out_size) + " bytes, need " + std::to_string(need));
  const int64_t panels = (w.rows + kPanelRows - 1) / kPanelRows;
  ThreadPool::global().run(panels, [&](int64_t p, int) {
    uint8_t* panel = out + static_cast<size_t>(p) * kPanelRows * rb;
    std::vector<uint8_t> zero;
    for (int i = 0; i < kPanelRows; ++i) {
      const int64_t r = p * kPanelRows + i;
      uint8_t* row;
      if (r < w.rows) {
        row = const_cast<uint8_t*>(w.data + r * stride);
      } else {  // padding rows are zero: scales 0, so they compute 0 (and are never stored)
        zero.assign(rb, 0);
        row = zero.data();
      }
      move_row(w.fmt, w.cols, panel, i, row, true);
    }
  });
}

void unpack_panels(const WeightMatrix& w, uint8_t* out, size_t out_size) {
  check_panel_matrix(w, "unpack_panels");
  if (w.layout != Layout::panels) throw KernelError("unpack_panels: the matrix is not in panels");
  const size_t rb = row_bytes(w.fmt, w.cols);
  if (!w.data || w.size_bytes < panel_bytes(w.fmt, w.rows, w.cols))
    throw KernelError("unpack_panels: the weight buffer is smaller than its panels");
  if (!out || out_size < rb * static_cast<size_t>(w.rows))
    throw KernelError("unpack_panels: output is smaller than the rows");
  for (int64_t r = 0; r < w.rows; ++r)
    panel_row(w.fmt, w.cols, w.data + static_cast<size_t>(r / kPanelRows) * kPanelRows * rb,
              static_cast<int>(r % kPanelRows), out + r * rb);
}

void panel_row(Format f, int64_t cols, const uint8_t* panel, int i, uint8_t* row) {
  move_row(f, cols, const_cast<uint8_t*>(panel), i, row, false);
}

}  // namespace ef
