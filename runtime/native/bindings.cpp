// Bindings of the native engine. The shape, options and memory structs are bound field by field:
// Python builds them directly (runtime/native_engine.py) and this file has no schema of its own.
// Every buffer the engine reads is checked here and kept alive for as long as the engine may read it.
#include "bind_engine.h"

#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>

#include "arrays.h"
#include "engine.h"
#include "neuron_cache.h"
#include "streaming.h"

namespace nb = nanobind;

namespace ef::engine {
namespace {

using namespace ef::bind;

void check_dims(int64_t rows, int64_t want_rows, int64_t cols, int64_t want_cols, const std::string& what) {
  const bool rows_ok = want_rows < 0 ? rows > 0 : rows == want_rows;
  const bool cols_ok = want_cols < 0 ? cols > 0 : cols == want_cols;
  if (!rows_ok || !cols_ok)
    throw KernelError(what + " is " + std::to_string(rows) + " x " + std::to_string(cols) + ", the model needs " +
                      std::to_string(want_rows) + " x " + std::to_string(want_cols));
}

Slot slot_named(const std::string& name) {
  Slot s;
  if (!parse_slot(name, &s)) throw KernelError("unknown layer tensor '" + name + "'");
  return s;
}

// Partial sums completed by a Python callable `fn(point, layer, x)` that sums the float32 array x
// over ranks in place (an MPI all-reduce); x is a view of the engine's buffer, valid during the call.
class PyPartialSums : public PartialSums {
 public:
  explicit PyPartialSums(nb::callable fn) : fn_(std::move(fn)) {}
  void complete(Point point, int64_t layer, float* x, int64_t count) override {
    nb::gil_scoped_acquire gil;
    try {
      const size_t shape[1] = {static_cast<size_t>(count)};
      // A view of the engine's buffer (rv_policy::reference: no copy, so the sum lands in place).
      nb::object view = nb::cast(nb::ndarray<nb::numpy, float, nb::ndim<1>>(x, 1, shape, nb::handle()),
                                 nb::rv_policy::reference);
      fn_(static_cast<int>(point), layer, view);
    } catch (nb::python_error& e) {  // the engine is C++ all the way up to the bindings: carry the message
      throw KernelError(std::string("completing partial sums across ranks failed: ") + e.what());
    }
  }

 private:
  nb::callable fn_;
};

// Owns the engine, the resident layer table, the streaming parts and references to every array
// the engine reads.
class PyEngine {
 public:
  PyEngine(const ModelShape& shape, std::vector<LayerShape> layers, const EngineOptions& options)
      : layers_(shape.n_layers) {
    for (const LayerShape& l : layers)
      if (static_cast<int64_t>(l.freq_factors.size()) != l.rot_dim / 2)
        throw KernelError("freq_factors must have rot_dim / 2 entries");
    engine_ = std::make_unique<Engine>(shape, std::move(layers), options);
    engine_->set_layer_source(&layers_);
  }

  // A weight matrix the engine reads. `stride` > 0: rows lie `stride` bytes apart (a neuron
  // arena's bundles), else packed. With `panels`, a packed matrix in a format the kernels run
  // faster from the panel layout is copied into it now (the copy is the engine's; `raw` is not
  // kept); *packed says whether it was. With `drop_source` (raw is a read-only file mapping), the
  // file's pages are dropped from this process slice by slice as they are copied, so a matrix is
  // never resident twice, not even while it is being laid out. With `in_place` (raw is this
  // process's own writable memory, read from flash and shared with nothing), a matrix of whole
  // panels is laid out in raw itself, through a small scratch: no second copy, not even briefly.
  WeightMatrix matrix(const In& raw, const std::string& fmt, int64_t rows, int64_t cols, size_t stride = 0,
                      bool panels = false, bool* packed = nullptr, bool drop_source = false, bool in_place = false) {
    const Format f = fmt_of(fmt);
    const size_t rb = row_bytes(f, cols);
    if (stride && stride < rb)
      throw KernelError("row stride " + std::to_string(stride) + " is shorter than a row of " + fmt + " x " +
                        std::to_string(cols));
    const size_t need = static_cast<size_t>(rows) * (stride ? stride : rb);
    if (nbytes(raw) != need)
      throw KernelError("weight buffer has " + std::to_string(nbytes(raw)) + " bytes, " + std::to_string(rows) +
                        " rows of " + fmt + " x " + std::to_string(cols) + " need " + std::to_string(need));
    const WeightMatrix w{bytes(raw, "weights"), need, f, rows, cols, stride};
    if (packed) *packed = false;
    if (panels && !stride && prefers_panels(f) && in_place && rows % kPanelRows == 0) {
      uint8_t* data = const_cast<uint8_t*>(w.data);
      {
        nb::gil_scoped_release release;
        const int64_t slice = std::max<int64_t>(kPanelRows, static_cast<int64_t>((1u << 20) / rb) / kPanelRows * kPanelRows);
        memory::AlignedBuffer scratch(static_cast<size_t>(std::min(slice, rows)) * rb);
        for (int64_t r0 = 0; r0 < rows; r0 += slice) {  // a slice's panels take exactly its rows' bytes
          const int64_t n = std::min(slice, rows - r0);
          std::memcpy(scratch.data(), data + r0 * rb, static_cast<size_t>(n) * rb);
          pack_panels(WeightMatrix{scratch.data(), static_cast<size_t>(n) * rb, f, n, cols, 0}, data + r0 * rb,
                      panel_bytes(f, n, cols));
        }
      }
      keep_.push_back(raw);
      laid_out_in_place_ += need;
      if (packed) *packed = true;
      return WeightMatrix{w.data, need, f, rows, cols, 0, Layout::panels};
    }
    if (panels && !stride && prefers_panels(f) && !in_place) {
      memory::AlignedBuffer buf(panel_bytes(f, rows, cols));
      {
        nb::gil_scoped_release release;
        const int64_t slice = std::max<int64_t>(kPanelRows, static_cast<int64_t>((4u << 20) / rb) / kPanelRows * kPanelRows);
        const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
        uintptr_t dropped = (reinterpret_cast<uintptr_t>(w.data) + page - 1) / page * page;  // first whole page
        for (int64_t r0 = 0; r0 < rows; r0 += slice) {
          const int64_t n = std::min(slice, rows - r0);
          const WeightMatrix part{w.data + r0 * rb, static_cast<size_t>(n) * rb, f, n, cols, 0};
          pack_panels(part, buf.data() + r0 * rb, panel_bytes(f, n, cols));
          const uintptr_t end = reinterpret_cast<uintptr_t>(w.data + (r0 + n) * rb) / page * page;
          if (drop_source && end > dropped) {
            ::madvise(reinterpret_cast<void*>(dropped), end - dropped, MADV_DONTNEED);
            dropped = end;
          }
        }
      }
      const WeightMatrix p{buf.data(), buf.size(), f, rows, cols, 0, Layout::panels};
      panels_.push_back(std::move(buf));
      if (packed) *packed = true;
      return p;
    }
    keep_.push_back(raw);
    return w;
  }

  void set_embedding(const In& raw, const std::string& fmt, int64_t rows, int64_t cols) {
    check_dims(rows, vocab_rows(), cols, shape().d_model, "embedding");
    engine_->set_embedding(matrix(raw, fmt, rows, cols));
  }

  bool set_head(const In& raw, const std::string& fmt, int64_t rows, int64_t cols, bool panels, bool drop_source,
                bool in_place) {
    check_dims(rows, vocab_rows(), cols, shape().d_model, "head");
    bool packed = false;
    engine_->set_head(matrix(raw, fmt, rows, cols, 0, panels, &packed, drop_source, in_place));
    return packed;
  }

  void set_head_shortlist(const In& raw, const std::string& fmt, const In& ids) {
    const int64_t k = static_cast<int64_t>(ids.size());
    const int32_t* p = exact<int32_t>(ids, static_cast<size_t>(k), "ids");
    keep_.push_back(ids);
    engine_->set_head_shortlist(matrix(raw, fmt, k, shape().d_model), std::vector<int32_t>(p, p + k));
  }

  void set_output_norm(const In& w) {
    keep_.push_back(w);
    engine_->set_output_norm(exact<float>(w, static_cast<size_t>(shape().d_model), "output_norm"));
  }

  bool set_matrix(int64_t layer, const std::string& name, const In& raw, const std::string& fmt, int64_t rows,
                  int64_t cols, size_t stride, bool panels, bool drop_source, bool in_place) {
    const Slot slot = slot_named(name);
    if (!is_matrix(slot)) throw KernelError("'" + name + "' is a vector, not a matrix");
    if ((slot == Slot::ffn_arena) != (stride > 0))
      throw KernelError("'" + name + "': only an FFN arena has a row stride (one neuron bundle)");
    const auto [want_rows, want_cols] = slot_dims(shape(), slot);
    check_dims(rows, want_rows, cols, want_cols, name);
    bool packed = false;
    layer_at(layer).matrix(slot) = matrix(raw, fmt, rows, cols, stride, panels, &packed, drop_source, in_place);
    if (slot == Slot::ffn_arena && panels && !in_place && prefers_panels(fmt_of(fmt)))
      packed = lay_out_arena(layer, layer_at(layer).ffn_arena, drop_source);
    return packed;
  }

  // A bundle's FFN arena laid out for the kernels: its gate and up rows copied into panels (run in
  // one pass on int8 activations like dense matrices) and its down columns into rows of their own
  // (the column product), slice by slice, the file's pages dropped as they are copied (with
  // `drop_source`), so the arena is never resident twice. The arena itself stays set (its pages
  // come back only for a run with activation thresholds, which reads neurons through it).
  bool lay_out_arena(int64_t layer, const WeightMatrix& a, bool drop_source) {
    const Format f = a.fmt, fd = engine_->arena_down_format(layer, f);
    const int64_t rows = a.rows, cols = a.cols;
    const size_t rb = row_bytes(f, cols), rbd = row_bytes(fd, cols);
    memory::AlignedBuffer gate(panel_bytes(f, rows, cols)), up(panel_bytes(f, rows, cols));
    memory::AlignedBuffer down(static_cast<size_t>(rows) * rbd);
    // Down columns for the int8 product are laid out as column panels (pack_columns) once copied.
    const bool column_panels = engine_->column_acts(fd) != ColumnActs::f32 && rows % 32 == 0;
    {
      nb::gil_scoped_release release;
      const int64_t slice = std::max<int64_t>(kPanelRows, static_cast<int64_t>((4u << 20) / a.stride) / kPanelRows * kPanelRows);
      const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
      uintptr_t dropped = (reinterpret_cast<uintptr_t>(a.data) + page - 1) / page * page;
      for (int64_t r0 = 0; r0 < rows; r0 += slice) {
        const int64_t n = std::min(slice, rows - r0);
        const uint8_t* base = a.data + static_cast<size_t>(r0) * a.stride;
        const size_t span = static_cast<size_t>(n - 1) * a.stride + 2 * rb;
        pack_panels(WeightMatrix{base, span, f, n, cols, a.stride}, gate.data() + r0 * rb, panel_bytes(f, n, cols));
        pack_panels(WeightMatrix{base + rb, span - rb, f, n, cols, a.stride}, up.data() + r0 * rb,
                    panel_bytes(f, n, cols));
        for (int64_t r = 0; r < n; ++r) std::memcpy(down.data() + (r0 + r) * rbd, base + r * a.stride + 2 * rb, rbd);
        const uintptr_t end = reinterpret_cast<uintptr_t>(base + static_cast<size_t>(n) * a.stride) / page * page;
        if (drop_source && end > dropped) {
          ::madvise(reinterpret_cast<void*>(dropped), end - dropped, MADV_DONTNEED);
          dropped = end;
        }
      }
      if (column_panels) {
        memory::AlignedBuffer packed(down.size());
        pack_columns(WeightMatrix{down.data(), down.size(), fd, rows, cols, 0}, packed.data(), packed.size());
        down = std::move(packed);
      }
    }
    LayerWeights& w = layer_at(layer);
    w.gate = WeightMatrix{gate.data(), gate.size(), f, rows, cols, 0, Layout::panels};
    w.up = WeightMatrix{up.data(), up.size(), f, rows, cols, 0, Layout::panels};
    w.down_columns = WeightMatrix{down.data(), down.size(), fd, rows, cols, 0,
                                  column_panels ? Layout::panels : Layout::rows};
    panels_.push_back(std::move(gate));
    panels_.push_back(std::move(up));
    panels_.push_back(std::move(down));
    return true;
  }

  void set_vector(int64_t layer, const std::string& name, const In& values) {
    const Slot slot = slot_named(name);
    if (is_matrix(slot)) throw KernelError("'" + name + "' is a matrix, not a vector");
    keep_.push_back(values);
    layer_at(layer).vector(slot) = exact<float>(values, static_cast<size_t>(slot_dims(shape(), slot).first),
                                                name.c_str());
  }

  // Layers [0, n) read the target engine's own layer weights (a self-drafting engine runs the
  // target's first layers): no copy, whatever layout the target laid them out in.
  void share_layers(PyEngine& target, int64_t n) {
    if (n < 1 || n > shape().n_layers || n > target.shape().n_layers)
      throw KernelError("share_layers: " + std::to_string(n) + " layers do not fit both engines");
    if (shape().d_model != target.shape().d_model || shape().d_ff != target.shape().d_ff)
      throw KernelError("share_layers: the engines' layer shapes differ");
    for (int64_t l = 0; l < n; ++l) layers_.at(l) = target.layers_.at(l);
  }

  // `out`: float32 [len(logit_rows), vocab] logits, or int32 [len(logit_rows)] for the argmax only.
  // `extend_tree`: the tokens grow the uncommitted tree (tree_mask n x (tree size + n), Engine::forward).
  void forward(const In& tokens, const In& positions, std::optional<In> tree_mask, const In& logit_rows, Out out,
               bool extend_tree) {
    const int64_t n = static_cast<int64_t>(tokens.size());
    const int32_t* tok = exact<int32_t>(tokens, static_cast<size_t>(n), "tokens");
    const int32_t* pos = exact<int32_t>(positions, static_cast<size_t>(n), "positions");
    const int64_t m = static_cast<int64_t>(logit_rows.size());
    const int32_t* rows = exact<int32_t>(logit_rows, static_cast<size_t>(m), "logit_rows");
    const bool argmax = out.dtype() == nb::dtype<int32_t>();
    if (argmax ? out.size() != static_cast<size_t>(m)
               : (out.dtype() != nb::dtype<float>() || out.size() != static_cast<size_t>(m * shape().vocab)))
      throw KernelError("out must be float32 [len(logit_rows), vocab] or int32 [len(logit_rows)]");
    const int64_t width = (extend_tree ? engine_->tree_size() : 0) + n;  // the tree's tokens each new one may see
    const uint8_t* mask = tree_mask ? exact<uint8_t>(*tree_mask, static_cast<size_t>(n * width), "tree_mask") : nullptr;
    float* logits = argmax ? nullptr : static_cast<float*>(out.data());
    int32_t* best = argmax ? static_cast<int32_t*>(out.data()) : nullptr;
    nb::gil_scoped_release release;
    engine_->forward(tok, pos, n, mask, rows, m, logits, best, extend_tree);
  }

  // The final-normed hidden states of the last forward's logit rows, float32 [rows, d_model].
  void hidden(Out out) const {
    const int64_t d = shape().d_model;
    if (out.dtype() != nb::dtype<float>() || out.size() % static_cast<size_t>(d))
      throw KernelError("out must be float32 [rows, d_model]");
    engine_->hidden(static_cast<float*>(out.data()), static_cast<int64_t>(out.size()) / d);
  }

  void commit(const In& nodes) {
    const int64_t n = static_cast<int64_t>(nodes.size());
    engine_->commit(exact<int32_t>(nodes, static_cast<size_t>(n), "nodes"), n);
  }

  // Stream what the plan lists from its file (layers not listed stay resident, as set_matrix and
  // set_vector gave them).
  // `lender`: an engine that computes in turn with this one (a draft model's target), whose
  // staging arena this one streams through instead of one of its own (streaming.h).
  void set_streaming(const memory::StreamingPlan& plan, const PyEngine* lender) {
    const memory::StreamingWeights* lent = lender ? lender->streaming_.get() : nullptr;
    if (lender && !lent) throw KernelError("the engine to borrow staging from streams nothing");
    for (const memory::StreamUnit& u : plan.units) {
      for (const memory::StreamedTensor& t : u.tensors) {
        if (u.layer >= 0) {
          const auto [want_rows, want_cols] = slot_dims(shape(), t.target);
          check_dims(t.rows, want_rows, t.cols, want_cols, slot_info(t.target).name);
        } else if (t.cols != shape().d_model || u.head_row0 < 0 || u.head_row0 + t.rows > vocab_rows()) {
          throw KernelError("head chunk rows or columns do not fit the model");
        }
      }
    }
    if (plan.stream_embedding)
      check_dims(plan.embedding.rows, vocab_rows(), plan.embedding.cols, shape().d_model, "embedding");
    reader_ = std::make_shared<memory::DirectReader>(plan.path, plan.direct, plan.io_threads, plan.chunk_bytes);
    streaming_ = std::make_unique<memory::StreamingWeights>(reader_, &layers_, shape().n_layers, plan.units,
                                                            plan.slots, plan.staging_bytes, plan.prefetch, lent);
    engine_->set_layer_source(streaming_.get());
    engine_->set_head_source(streaming_->streams_head() ? streaming_.get() : nullptr);
    if (plan.stream_embedding) {
      const memory::StreamedTensor& e = plan.embedding;
      embedding_ = std::make_unique<memory::StreamedEmbedding>(reader_, static_cast<int64_t>(e.offset), e.fmt,
                                                               e.rows, e.cols);
      engine_->set_embedding_source(embedding_.get());
    }
  }

  // Approximate feed-forward for every layer from the bundle's neuron arenas (bundles of gate row,
  // up row, down column in the given formats). The predictors are layer matrices (pred_a, pred_b).
  // Needs set_streaming first (its reader).
  void set_sparse_ffn(std::vector<memory::SparseLayerSpec> layers, const std::string& gate, const std::string& up,
                      const std::string& down, int64_t capacity, int64_t window) {
    if (!reader_) throw KernelError("set_sparse_ffn needs set_streaming first");
    if (static_cast<int64_t>(layers.size()) != shape().n_layers) throw KernelError("one sparse spec per layer is needed");
    for (const memory::SparseLayerSpec& l : layers)
      if (l.n_neurons() != shape().d_ff) throw KernelError("the arena must hold d_ff neurons");
    sparse_ = std::make_unique<memory::NeuronCacheFfn>(reader_, std::move(layers), shape().d_model, fmt_of(gate),
                                                       fmt_of(up), fmt_of(down), shape().act, capacity, window);
    engine_->set_ffn_hook(sparse_.get());
  }

  void set_sparse_chunks(int64_t chunk, float keep, int64_t resident) {
    if (!sparse_) throw KernelError("set_sparse_chunks needs set_sparse_ffn first");
    nb::gil_scoped_release release;
    sparse_->set_chunks(chunk, keep, resident);
  }

  std::optional<memory::NeuronCacheStats> neuron_stats() const {
    if (!sparse_) return std::nullopt;
    return sparse_->stats();
  }
  size_t neuron_cache_bytes() const { return sparse_ ? sparse_->cache_bytes() : 0; }

  std::optional<memory::ReaderStats> reader_stats() const {
    if (!reader_) return std::nullopt;
    return reader_->stats();
  }
  std::optional<memory::StreamStats> stream_stats() const {
    if (!streaming_) return std::nullopt;
    return streaming_->stats();
  }
  size_t staging_bytes() const { return streaming_ ? streaming_->staging_bytes() : 0; }  // 0 when borrowed
  int64_t retained_units() const { return streaming_ ? streaming_->retained_units() : 0; }

  // Per-operation seconds and call counts of the forward passes since profiling was turned on,
  // plus "passes" and "tokens" (op_profile.h).
  nb::dict profile() const {
    const OpProfile& p = engine_->profile();
    nb::dict out;
    for (int i = 0; i < kOpCount; ++i)
      out[op_name(static_cast<Op>(i))] = nb::make_tuple(p.seconds[i], p.calls[i]);
    out["passes"] = p.passes;
    out["tokens"] = p.tokens;
    return out;
  }

  void set_ffn_thresholds(std::vector<float> thresholds) { engine_->set_ffn_thresholds(std::move(thresholds)); }
  void set_arena_down_format(int64_t layer, const std::string& fmt) { engine_->set_arena_down_format(layer, fmt_of(fmt)); }
  // Tensor parallelism: `fn(point, layer, x)` sums x over the ranks in place (PyPartialSums).
  void set_partial_sums(nb::callable fn) {
    partial_sums_ = std::make_unique<PyPartialSums>(std::move(fn));
    engine_->set_partial_sums(partial_sums_.get());
  }

  int64_t truncate(int64_t n) { return engine_->truncate(n); }
  int64_t committed() const { return engine_->committed(); }
  int64_t tree_size() const { return engine_->tree_size(); }
  EngineMemory memory() const { return engine_->memory(); }
  size_t laid_out_bytes() const {  // the copies of matrices laid out in panels at load
    size_t total = 0;
    for (const auto& b : panels_) total += b.size();
    return total;
  }
  size_t laid_out_in_place_bytes() const { return laid_out_in_place_; }  // matrices laid out where they were read
  void set_profiling(bool on) { engine_->set_profiling(on); }

 private:
  const ModelShape& shape() const { return engine_->shape(); }
  int64_t vocab_rows() const { return shape().vocab_end - shape().vocab_begin; }  // embedding and head rows held

  LayerWeights& layer_at(int64_t layer) {
    if (layer < 0 || layer >= shape().n_layers) throw KernelError("layer index out of range");
    return layers_.at(layer);
  }

  ResidentLayers layers_;
  std::shared_ptr<memory::DirectReader> reader_;
  std::unique_ptr<memory::StreamingWeights> streaming_;
  std::unique_ptr<memory::StreamedEmbedding> embedding_;
  std::unique_ptr<memory::NeuronCacheFfn> sparse_;
  std::unique_ptr<PyPartialSums> partial_sums_;
  std::unique_ptr<Engine> engine_;  // declared last: destroyed first, before what it reads
  std::vector<In> keep_;  // every array the engine reads stays alive with it
  std::vector<memory::AlignedBuffer> panels_;  // matrices laid out in panels at load
  size_t laid_out_in_place_ = 0;  // bytes of matrices laid out in panels in their own buffers
};

const char* act_mode_name(ActMode a) { return a == ActMode::q8 ? "q8" : a == ActMode::q8x2 ? "q8x2" : "f32"; }

ActMode act_mode_named(const std::string& name) {
  if (name == "q8") return ActMode::q8;
  if (name == "q8x2") return ActMode::q8x2;
  if (name == "f32") return ActMode::f32;
  throw KernelError("activations must be q8, q8x2 or f32, got '" + name + "'");
}

}  // namespace

void bind_engine(nb::module_& m) {
  nb::class_<ModelShape>(m, "ModelShape")
      .def(nb::init<>())
      .def_rw("n_layers", &ModelShape::n_layers)
      .def_rw("d_model", &ModelShape::d_model)
      .def_rw("n_heads", &ModelShape::n_heads)
      .def_rw("n_kv_heads", &ModelShape::n_kv_heads)
      .def_rw("head_dim", &ModelShape::head_dim)
      .def_rw("d_ff", &ModelShape::d_ff)
      .def_rw("vocab", &ModelShape::vocab)
      .def_rw("norm_eps", &ModelShape::norm_eps)
      .def_rw("embedding_scale", &ModelShape::embedding_scale)
      .def_rw("attn_scale", &ModelShape::attn_scale)
      .def_rw("final_softcap", &ModelShape::final_softcap)
      .def_prop_rw(
          "activation", [](const ModelShape& s) { return std::string(s.act == Activation::silu ? "silu" : "gelu_tanh"); },
          [](ModelShape& s, const std::string& name) { s.act = act_of(name); })
      .def_rw("qk_norm", &ModelShape::qk_norm)
      .def_rw("sandwich_norm", &ModelShape::sandwich_norm)
      .def_rw("vocab_begin", &ModelShape::vocab_begin)
      .def_rw("vocab_end", &ModelShape::vocab_end);

  nb::class_<LayerShape>(m, "LayerShape")
      .def(nb::init<>())
      .def_rw("window", &LayerShape::window)
      .def_rw("rot_dim", &LayerShape::rot_dim)
      .def_rw("freq_factors", &LayerShape::freq_factors)
      .def_rw("theta_base", &LayerShape::theta_base);

  nb::class_<EngineOptions>(m, "EngineOptions")
      .def(nb::init<>())
      .def_rw("context", &EngineOptions::context)
      .def_rw("max_batch", &EngineOptions::max_batch)
      .def_prop_rw(
          "kv_format", [](const EngineOptions& o) { return std::string(format_info(o.kv_format).name); },
          [](EngineOptions& o, const std::string& name) { o.kv_format = fmt_of(name); })
      .def_prop_rw(
          "activations", [](const EngineOptions& o) { return std::string(act_mode_name(o.act_mode)); },
          [](EngineOptions& o, const std::string& name) { o.act_mode = act_mode_named(name); })
      .def_rw("head_chunk", &EngineOptions::head_chunk);

  nb::class_<EngineMemory>(m, "EngineMemory")
      .def_ro("kv_cache", &EngineMemory::kv_cache)
      .def_ro("activations", &EngineMemory::activations);

  m.def("plan_memory", &plan_memory, nb::arg("shape"), nb::arg("layers"), nb::arg("options"),
        "Bytes of the KV cache and work buffers an engine of this shape and options allocates.");

  nb::class_<PyEngine>(m, "Engine")
      .def(nb::init<const ModelShape&, std::vector<LayerShape>, const EngineOptions&>(), nb::arg("shape"),
           nb::arg("layers"), nb::arg("options"))
      .def("set_embedding", &PyEngine::set_embedding)
      .def("set_head", &PyEngine::set_head, nb::arg("raw"), nb::arg("fmt"), nb::arg("rows"), nb::arg("cols"),
           nb::arg("panels") = false, nb::arg("drop_source") = false, nb::arg("in_place") = false,
           "Set the head; panels, drop_source and in_place as for set_matrix (returns whether it was laid out).")
      .def("set_output_norm", &PyEngine::set_output_norm)
      .def("set_head_shortlist", &PyEngine::set_head_shortlist)
      .def("set_matrix", &PyEngine::set_matrix, nb::arg("layer"), nb::arg("name"), nb::arg("raw"), nb::arg("fmt"),
           nb::arg("rows"), nb::arg("cols"), nb::arg("stride") = 0, nb::arg("panels") = false,
           nb::arg("drop_source") = false, nb::arg("in_place") = false,
           "Set a layer matrix; stride > 0 only for an FFN arena (bytes from one neuron bundle to the next); "
           "with panels, lay it out for the kernels now (returns whether it was); with drop_source "
           "(raw is a read-only file mapping), its pages are dropped as they are copied; with in_place "
           "(raw is writable memory of this process, shared with nothing), a matrix of whole panels is "
           "laid out in raw itself (raw's bytes are then panels).")
      .def("set_vector", &PyEngine::set_vector)
      .def("share_layers", &PyEngine::share_layers, nb::arg("target"), nb::arg("layers"), nb::keep_alive<1, 2>(),
           "Run layers [0, layers) on the target engine's own layer weights (kept alive with this engine).")
      .def("forward", &PyEngine::forward, nb::arg("tokens"), nb::arg("positions"), nb::arg("tree_mask").none(),
           nb::arg("logit_rows"), nb::arg("out"), nb::arg("extend_tree") = false)
      .def("commit", &PyEngine::commit)
      .def("hidden", &PyEngine::hidden, nb::arg("out"),
           "Copy the final-normed hidden states of the last forward's logit rows into out [rows, d_model].")
      .def("set_profiling", [](PyEngine& e, bool on) { e.set_profiling(on); }, nb::arg("on"),
           "Time each operation of the forward passes from now on (on) or stop (off); clears the times.")
      .def("profile", &PyEngine::profile)
      .def("truncate", &PyEngine::truncate)
      .def("set_streaming", &PyEngine::set_streaming, nb::arg("plan"), nb::arg("lender").none() = nb::none())
      .def("set_sparse_ffn", &PyEngine::set_sparse_ffn, nb::arg("layers"), nb::arg("gate"), nb::arg("up"),
           nb::arg("down"), nb::arg("capacity"), nb::arg("window"))
      .def("set_sparse_chunks", &PyEngine::set_sparse_chunks, nb::arg("chunk"), nb::arg("keep"), nb::arg("resident"))
      .def("set_ffn_thresholds", &PyEngine::set_ffn_thresholds, nb::arg("thresholds"))
      .def("set_arena_down_format", &PyEngine::set_arena_down_format, nb::arg("layer"), nb::arg("fmt"))
      .def("set_partial_sums", &PyEngine::set_partial_sums, nb::arg("fn"))
      .def("reader_stats", &PyEngine::reader_stats)
      .def("stream_stats", &PyEngine::stream_stats)
      .def("neuron_stats", &PyEngine::neuron_stats)
      .def_prop_ro("staging_bytes", &PyEngine::staging_bytes)
      .def_prop_ro("retained_units", &PyEngine::retained_units)
      .def_prop_ro("neuron_cache_bytes", &PyEngine::neuron_cache_bytes)
      .def_prop_ro("committed", &PyEngine::committed)
      .def_prop_ro("tree_size", &PyEngine::tree_size, "Tree tokens forwarded and not yet committed.")
      .def_prop_ro("laid_out_bytes", &PyEngine::laid_out_bytes)
      .def_prop_ro("laid_out_in_place_bytes", &PyEngine::laid_out_in_place_bytes)
      .def("memory", &PyEngine::memory);
}

}  // namespace ef::engine
