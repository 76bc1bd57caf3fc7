// Bindings of the kernel API (kernels/include/edgeflash/), registered on the _native module by
// its composition root (runtime/native/module.cpp). The Python wrappers (kernels/*.py) validate
// arguments and word the errors; this layer checks again so that no call can reach a kernel with a
// buffer too small for it. KernelError derives from std::invalid_argument: ValueError in Python.
#include "bind_kernels.h"

#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <optional>
#include <string>

#include "arrays.h"
#include "edgeflash/kernels.h"

namespace nb = nanobind;
using namespace ef::bind;

namespace {

ef::WeightMatrix weights(const In& w, const std::string& fmt, int64_t rows, int64_t cols, size_t stride,
                         bool panels = false) {
  return ef::WeightMatrix{bytes(w, "w"), nbytes(w), fmt_of(fmt), rows, cols, stride,
                          panels ? ef::Layout::panels : ef::Layout::rows};
}

ef::KvCache cache(const Out& k, const Out& v, const std::string& fmt, int64_t n_kv, int64_t cap, int64_t hd,
                  const Out& slot_pos, const std::optional<Out>& sealed, int64_t rope_dim = 0,
                  float rope_theta = 10000.0f) {
  if (!sealed && nbytes(k) != nbytes(v)) throw ef::KernelError("k_cache and v_cache differ in size");
  // A kivi2 cache sized without a ring buffer says so by its size.
  const bool wraps = !sealed || nbytes(k) != ef::kv_key_bytes(ef::Format::kivi2, n_kv, cap, hd, false);
  return ef::KvCache{const_cast<uint8_t*>(bytes(k, "k_cache")), const_cast<uint8_t*>(bytes(v, "v_cache")), nbytes(k),
                     fmt_of(fmt), n_kv, cap, hd, ptr<int32_t>(slot_pos, static_cast<size_t>(cap), "slot_pos"),
                     sealed ? ptr<int64_t>(*sealed, 1, "sealed") : nullptr, nbytes(v), wraps,
                     ef::RopeParams{rope_dim, rope_theta}};
}

}  // namespace

void ef::bind_kernels(nb::module_& m) {
  // The format table (formats.cpp) with what this build can do with each format.
  m.def("format_table", [] {
    nb::list out;
    for (int i = 0; i < ef::kFormatCount; ++i) {
      const ef::Format f = static_cast<ef::Format>(i);
      if (f == ef::Format::kivi2) continue;  // a KV cache format, never a weight's
      const ef::FormatInfo& info = ef::format_info(f);
      nb::dict d;
      d["name"] = info.name;
      d["ggml_type"] = info.ggml_type;
      d["block_elems"] = info.block_elems;
      d["block_bytes"] = info.block_bytes;
      d["row_header"] = info.row_header;
      d["quantized"] = info.quantized;
      d["runs"] = ef::runs_format(f);
      d["quantizable"] = ef::can_quantize(f);
      out.append(d);
    }
    return out;
  });


  // ---- dispatch, threads, formats
  m.def("cpu_features", [] {
    const auto& f = ef::cpu_features();
    nb::dict d;
    d["arch"] = f.arch;
    d["flags"] = f.flags;
    return d;
  });
  m.def("available_isas", &ef::available_isas);
  m.def("use_isa", &ef::use_isa);
  m.def("current_isa", &ef::current_isa);
  m.def("implementations", [] {
    nb::dict d;
    for (const auto& [k, v] : ef::implementations()) d[k.c_str()] = v;
    return d;
  });
  m.def("set_num_threads", &ef::set_num_threads);
  m.def("get_num_threads", &ef::get_num_threads);
  m.def("row_bytes", [](const std::string& fmt, int64_t cols) { return ef::row_bytes(fmt_of(fmt), cols); });
  m.def("bundle_bytes", [](const std::string& g, const std::string& u, const std::string& d, int64_t dm) {
    return ef::bundle_bytes(fmt_of(g), fmt_of(u), fmt_of(d), dm);
  });
  m.def("kv_row_bytes", [](const std::string& fmt, int64_t hd) { return ef::kv_row_bytes(fmt_of(fmt), hd); });
  m.def("kv_capacity", [](const std::string& fmt, int64_t slots) { return ef::kv_capacity(fmt_of(fmt), slots); });
  m.def("kv_cache_bytes", [](const std::string& fmt, int64_t n_kv, int64_t cap, int64_t hd, bool wraps) {
    return ef::kv_cache_bytes(fmt_of(fmt), n_kv, cap, hd, wraps);
  });
  m.def("kv_key_bytes", [](const std::string& fmt, int64_t n_kv, int64_t cap, int64_t hd, bool wraps) {
    return ef::kv_key_bytes(fmt_of(fmt), n_kv, cap, hd, wraps);
  });
  m.def("kv_recent_slots", &ef::kv_recent_slots);
  m.def("kv_recent", &ef::kv_recent);
  m.def("kivi_constants", [] {
    nb::dict d;
    d["group"] = ef::kKiviGroup, d["key_group"] = ef::kKiviKeyGroup;
    d["key_bits"] = ef::kKiviKeyBits, d["key_bits_max"] = ef::kKiviKeyBitsMax;
    d["recent_min"] = ef::kKiviRecentMin, d["recent_max"] = ef::kKiviRecentMax;
    d["max_write"] = ef::kKiviMaxWrite;
    return d;
  });

  // ---- linear
  m.def("matmul", [](In w, const std::string& fmt, int64_t rows, int64_t cols, size_t stride, In x, int64_t n,
                     Out y, bool precise, bool panels) {
    const ef::WeightMatrix wm = weights(w, fmt, rows, cols, stride, panels);
    const float* xp = ptr<float>(x, static_cast<size_t>(n * cols), "x");
    float* yp = ptr<float>(y, static_cast<size_t>(n * rows), "out");
    nb::gil_scoped_release release;
    ef::matmul(wm, xp, n, yp, precise ? ef::ActPrecision::f32 : ef::ActPrecision::q8);
  }, nb::arg("w"), nb::arg("fmt"), nb::arg("rows"), nb::arg("cols"), nb::arg("stride"), nb::arg("x"), nb::arg("n"),
     nb::arg("y"), nb::arg("precise"), nb::arg("panels") = false);
  // ---- the panel layout
  m.def("has_panels", [](const std::string& fmt) { return ef::has_panels(fmt_of(fmt)); });
  m.def("prefers_panels", [](const std::string& fmt) { return ef::prefers_panels(fmt_of(fmt)); });
  m.def("panel_bytes", [](const std::string& fmt, int64_t rows, int64_t cols) {
    return ef::panel_bytes(fmt_of(fmt), rows, cols);
  });
  m.def("pack_panels", [](In w, const std::string& fmt, int64_t rows, int64_t cols, Out out) {
    const ef::WeightMatrix wm = weights(w, fmt, rows, cols, 0);
    uint8_t* op = ptr<uint8_t>(out, ef::panel_bytes(wm.fmt, rows, cols), "out");
    nb::gil_scoped_release release;
    ef::pack_panels(wm, op, nbytes(out));
  });
  m.def("unpack_panels", [](In w, const std::string& fmt, int64_t rows, int64_t cols, Out out) {
    const ef::WeightMatrix wm = weights(w, fmt, rows, cols, 0, true);
    uint8_t* op = ptr<uint8_t>(out, rows * ef::row_bytes(wm.fmt, cols), "out");
    nb::gil_scoped_release release;
    ef::unpack_panels(wm, op, nbytes(out));
  });
  m.def("matmul_rows", [](In w, const std::string& fmt, int64_t rows, int64_t cols, size_t stride, In ids, In x,
                          int64_t n, Out y, bool precise) {
    const ef::WeightMatrix wm = weights(w, fmt, rows, cols, stride);
    const int64_t k = static_cast<int64_t>(ids.size());
    const int32_t* ip = ptr<int32_t>(ids, static_cast<size_t>(k), "rows");
    const float* xp = ptr<float>(x, static_cast<size_t>(n * cols), "x");
    float* yp = ptr<float>(y, static_cast<size_t>(n * k), "out");
    nb::gil_scoped_release release;
    ef::matmul_rows(wm, ip, k, xp, n, yp, precise ? ef::ActPrecision::f32 : ef::ActPrecision::q8);
  });
  m.def("matmul_columns", [](In w, const std::string& fmt, int64_t rows, int64_t cols, size_t stride, In h, int64_t n,
                             Out y, const std::string& acts, bool panels) {
    const ef::WeightMatrix wm = weights(w, fmt, rows, cols, stride, panels);
    const float* hp = ptr<float>(h, static_cast<size_t>(n * rows), "h");
    float* yp = ptr<float>(y, static_cast<size_t>(n * cols), "out");
    ef::ColumnActs a = ef::ColumnActs::f32;
    if (acts == "q8") a = ef::ColumnActs::q8;
    else if (acts == "q8x2") a = ef::ColumnActs::q8x2;
    else if (acts != "f32") throw ef::KernelError("matmul_columns: acts = '" + acts + "', expected f32, q8 or q8x2");
    nb::gil_scoped_release release;
    ef::matmul_columns(wm, hp, n, yp, a);
  }, nb::arg("w"), nb::arg("fmt"), nb::arg("rows"), nb::arg("cols"), nb::arg("stride"), nb::arg("h"), nb::arg("n"),
     nb::arg("y"), nb::arg("acts") = "f32", nb::arg("panels") = false);
  m.def("pack_columns", [](In w, const std::string& fmt, int64_t rows, int64_t cols, Out out) {
    const ef::WeightMatrix wm = weights(w, fmt, rows, cols, 0);
    uint8_t* op = ptr<uint8_t>(out, wm.size_bytes, "out");
    nb::gil_scoped_release release;
    ef::pack_columns(wm, op, wm.size_bytes);
  });
  m.def("prefers_int8_columns", [](const std::string& fmt) { return ef::prefers_int8_columns(fmt_of(fmt)); });
  m.def("dequantize", [](In w, const std::string& fmt, int64_t rows, int64_t cols, size_t stride,
                         std::optional<In> ids, Out out) {
    const ef::WeightMatrix wm = weights(w, fmt, rows, cols, stride);
    const int64_t k = ids ? static_cast<int64_t>(ids->size()) : rows;
    const int32_t* ip = ids ? ptr<int32_t>(*ids, static_cast<size_t>(k), "rows") : nullptr;
    float* op = ptr<float>(out, static_cast<size_t>(k * cols), "out");
    nb::gil_scoped_release release;
    ef::dequantize_rows(wm, ip, k, op);
  });
  m.def("quantize", [](In x, int64_t rows, int64_t cols, const std::string& fmt, Out out) {
    const float* xp = ptr<float>(x, static_cast<size_t>(rows * cols), "w");
    uint8_t* op = ptr<uint8_t>(out, 0, "out");
    const size_t cap = nbytes(out);
    const ef::Format f = fmt_of(fmt);
    nb::gil_scoped_release release;
    ef::quantize_rows(xp, rows, cols, f, op, cap);
  });
  m.def("quantize_q4_lut", [](In x, int64_t rows, int64_t cols, std::optional<In> importance, Out out) {
    const float* xp = ptr<float>(x, static_cast<size_t>(rows * cols), "w");
    const float* ip = importance ? ptr<float>(*importance, static_cast<size_t>(cols), "importance") : nullptr;
    uint8_t* op = ptr<uint8_t>(out, 0, "out");
    const size_t cap = nbytes(out);
    nb::gil_scoped_release release;
    ef::quantize_q4_lut_rows(xp, rows, cols, ip, op, cap);
  });

  // ---- sparse FFN
  m.def("ffn_sparse", [](In arena, int64_t n_slots, int64_t dm, const std::string& g, const std::string& u,
                         const std::string& d, size_t stride, In x, int64_t n_tok, In slots, const std::string& act,
                         std::optional<In> thresholds, Out out, bool accumulate) {
    const ef::NeuronArena a{bytes(arena, "arena"), nbytes(arena), n_slots, dm, fmt_of(g), fmt_of(u), fmt_of(d), stride};
    const float* xp = ptr<float>(x, static_cast<size_t>(n_tok * dm), "x");
    const int64_t k = static_cast<int64_t>(slots.size());
    const int32_t* sp = ptr<int32_t>(slots, static_cast<size_t>(k), "slots");
    const float* tp = thresholds ? ptr<float>(*thresholds, static_cast<size_t>(n_tok), "thresholds") : nullptr;
    float* op = ptr<float>(out, static_cast<size_t>(n_tok * dm), "out");
    const ef::Activation ac = act_of(act);
    nb::gil_scoped_release release;
    ef::ffn_sparse(a, xp, n_tok, sp, k, ac, tp, op, accumulate);
  });

  // ---- attention
  m.def("attention", [](Out k, Out v, const std::string& fmt, int64_t n_kv, int64_t cap, int64_t hd, Out slot_pos,
                        In q, int64_t n_q, int64_t n_heads, In q_pos, int64_t window, std::optional<In> mask,
                        float scale, float softcap, Out out, std::optional<Out> sealed, int64_t rope_dim,
                        float rope_theta) {
    const ef::KvCache c = cache(k, v, fmt, n_kv, cap, hd, slot_pos, sealed, rope_dim, rope_theta);
    ef::AttentionArgs a;
    a.q = ptr<float>(q, static_cast<size_t>(n_q * n_heads * hd), "q");
    a.n_q = n_q, a.n_heads = n_heads;
    a.q_pos = ptr<int32_t>(q_pos, static_cast<size_t>(n_q), "q_pos");
    a.window = window;
    a.mask = mask ? reinterpret_cast<const uint8_t*>(ptr<bool>(*mask, static_cast<size_t>(n_q * cap), "mask")) : nullptr;
    a.scale = scale, a.softcap = softcap;
    a.out = ptr<float>(out, static_cast<size_t>(n_q * n_heads * hd), "out");
    nb::gil_scoped_release release;
    ef::attention(c, a);
  });
  m.def("kv_write", [](Out kc, Out vc, const std::string& fmt, int64_t n_kv, int64_t cap, int64_t hd, Out slot_pos,
                       In k, In v, int64_t n, In slots, In positions, std::optional<Out> sealed, int64_t rope_dim,
                       float rope_theta) {
    const ef::KvCache c = cache(kc, vc, fmt, n_kv, cap, hd, slot_pos, sealed, rope_dim, rope_theta);
    const float* kp = ptr<float>(k, static_cast<size_t>(n * n_kv * hd), "k");
    const float* vp = ptr<float>(v, static_cast<size_t>(n * n_kv * hd), "v");
    const int32_t* sp = ptr<int32_t>(slots, static_cast<size_t>(n), "slots");
    const int32_t* pp = ptr<int32_t>(positions, static_cast<size_t>(n), "positions");
    nb::gil_scoped_release release;
    ef::kv_write(c, kp, vp, n, sp, pp);
  });
  m.def("kv_read", [](Out kc, Out vc, const std::string& fmt, int64_t n_kv, int64_t cap, int64_t hd, Out slot_pos,
                      std::optional<Out> sealed, Out k, Out v, int64_t rope_dim, float rope_theta) {
    const ef::KvCache c = cache(kc, vc, fmt, n_kv, cap, hd, slot_pos, sealed, rope_dim, rope_theta);
    float* kp = ptr<float>(k, static_cast<size_t>(n_kv * cap * hd), "k");
    float* vp = ptr<float>(v, static_cast<size_t>(n_kv * cap * hd), "v");
    nb::gil_scoped_release release;
    ef::kv_read(c, kp, vp);
  });

  // ---- elementwise and sampling
  m.def("rms_norm", [](In x, In w, Out y, int64_t n, int64_t d, float eps) {
    const float* xp = ptr<float>(x, static_cast<size_t>(n * d), "x");
    const float* wp = ptr<float>(w, static_cast<size_t>(d), "weight");
    float* yp = ptr<float>(y, static_cast<size_t>(n * d), "out");
    nb::gil_scoped_release release;
    ef::rms_norm(xp, wp, yp, n, d, eps);
  });
  m.def("rope", [](Out x, int64_t n, int64_t heads, int64_t hd, In positions, int64_t rot_dim, float theta,
                   std::optional<In> freq, float scale) {
    float* xp = ptr<float>(x, static_cast<size_t>(n * heads * hd), "x");
    ef::RopeParams p;
    p.rot_dim = rot_dim, p.theta_base = theta, p.linear_scale = scale;
    p.freq_factors = freq ? ptr<float>(*freq, static_cast<size_t>(rot_dim / 2), "freq_factors") : nullptr;
    const int32_t* pp = ptr<int32_t>(positions, static_cast<size_t>(n), "positions");
    nb::gil_scoped_release release;
    ef::rope(xp, n, heads, hd, pp, p);
  });
  m.def("gated_act", [](In g, In u, Out out, int64_t count, const std::string& act) {
    const float* gp = ptr<float>(g, static_cast<size_t>(count), "gate");
    const float* up = ptr<float>(u, static_cast<size_t>(count), "up");
    float* op = ptr<float>(out, static_cast<size_t>(count), "out");
    const ef::Activation a = act_of(act);
    nb::gil_scoped_release release;
    ef::gated_act(gp, up, op, count, a);
  });
  m.def("softmax", [](In x, Out y, int64_t n, int64_t d) {
    const float* xp = ptr<float>(x, static_cast<size_t>(n * d), "x");
    float* yp = ptr<float>(y, static_cast<size_t>(n * d), "out");
    nb::gil_scoped_release release;
    ef::softmax(xp, yp, n, d);
  });
  m.def("argmax", [](In x, int64_t n, int64_t d, Out out) {
    const float* xp = ptr<float>(x, static_cast<size_t>(n * d), "x");
    int32_t* op = ptr<int32_t>(out, static_cast<size_t>(n), "out");
    nb::gil_scoped_release release;
    ef::argmax(xp, n, d, op);
  });
  m.def("topk", [](In x, int64_t n, int64_t d, int64_t k, Out values, Out indices) {
    const float* xp = ptr<float>(x, static_cast<size_t>(n * d), "x");
    float* vp = ptr<float>(values, static_cast<size_t>(n * k), "values");
    int32_t* ip = ptr<int32_t>(indices, static_cast<size_t>(n * k), "indices");
    nb::gil_scoped_release release;
    ef::topk(xp, n, d, k, vp, ip);
  });
  m.def("timed_read", [](In buf) {
    const uint8_t* p = bytes(buf, "buffer");
    const size_t n = nbytes(buf);
    nb::gil_scoped_release release;
    return ef::timed_read(p, n);
  });
}
