// Bindings of the native engine. The shape, options and memory structs are bound field by field:
// Python builds them directly (runtime/native_engine.py) and this file has no schema of its own.
// Every buffer the engine reads is checked here and kept alive for as long as the engine may read it.
#include "bind_engine.h"

#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

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

  // `stride` > 0: rows lie `stride` bytes apart (a neuron arena's bundles), else packed.
  WeightMatrix matrix(const In& raw, const std::string& fmt, int64_t rows, int64_t cols, size_t stride = 0) {
    const Format f = fmt_of(fmt);
    if (stride && stride < row_bytes(f, cols))
      throw KernelError("row stride " + std::to_string(stride) + " is shorter than a row of " + fmt + " x " +
                        std::to_string(cols));
    const size_t need = static_cast<size_t>(rows) * (stride ? stride : row_bytes(f, cols));
    if (nbytes(raw) != need)
      throw KernelError("weight buffer has " + std::to_string(nbytes(raw)) + " bytes, " + std::to_string(rows) +
                        " rows of " + fmt + " x " + std::to_string(cols) + " need " + std::to_string(need));
    keep_.push_back(raw);
    return WeightMatrix{bytes(raw, "weights"), need, f, rows, cols, stride};
  }

  void set_embedding(const In& raw, const std::string& fmt, int64_t rows, int64_t cols) {
    check_dims(rows, vocab_rows(), cols, shape().d_model, "embedding");
    engine_->set_embedding(matrix(raw, fmt, rows, cols));
  }

  void set_head(const In& raw, const std::string& fmt, int64_t rows, int64_t cols) {
    check_dims(rows, vocab_rows(), cols, shape().d_model, "head");
    engine_->set_head(matrix(raw, fmt, rows, cols));
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

  void set_matrix(int64_t layer, const std::string& name, const In& raw, const std::string& fmt, int64_t rows,
                  int64_t cols, size_t stride) {
    const Slot slot = slot_named(name);
    if (!is_matrix(slot)) throw KernelError("'" + name + "' is a vector, not a matrix");
    if ((slot == Slot::ffn_arena) != (stride > 0))
      throw KernelError("'" + name + "': only an FFN arena has a row stride (one neuron bundle)");
    const auto [want_rows, want_cols] = slot_dims(shape(), slot);
    check_dims(rows, want_rows, cols, want_cols, name);
    layer_at(layer).matrix(slot) = matrix(raw, fmt, rows, cols, stride);
  }

  void set_vector(int64_t layer, const std::string& name, const In& values) {
    const Slot slot = slot_named(name);
    if (is_matrix(slot)) throw KernelError("'" + name + "' is a matrix, not a vector");
    keep_.push_back(values);
    layer_at(layer).vector(slot) = exact<float>(values, static_cast<size_t>(slot_dims(shape(), slot).first),
                                                name.c_str());
  }

  // `out`: float32 [len(logit_rows), vocab] logits, or int32 [len(logit_rows)] for the argmax only.
  void forward(const In& tokens, const In& positions, std::optional<In> tree_mask, const In& logit_rows, Out out) {
    const int64_t n = static_cast<int64_t>(tokens.size());
    const int32_t* tok = exact<int32_t>(tokens, static_cast<size_t>(n), "tokens");
    const int32_t* pos = exact<int32_t>(positions, static_cast<size_t>(n), "positions");
    const int64_t m = static_cast<int64_t>(logit_rows.size());
    const int32_t* rows = exact<int32_t>(logit_rows, static_cast<size_t>(m), "logit_rows");
    const bool argmax = out.dtype() == nb::dtype<int32_t>();
    if (argmax ? out.size() != static_cast<size_t>(m)
               : (out.dtype() != nb::dtype<float>() || out.size() != static_cast<size_t>(m * shape().vocab)))
      throw KernelError("out must be float32 [len(logit_rows), vocab] or int32 [len(logit_rows)]");
    const uint8_t* mask = tree_mask ? exact<uint8_t>(*tree_mask, static_cast<size_t>(n * n), "tree_mask") : nullptr;
    float* logits = argmax ? nullptr : static_cast<float*>(out.data());
    int32_t* best = argmax ? static_cast<int32_t*>(out.data()) : nullptr;
    nb::gil_scoped_release release;
    engine_->forward(tok, pos, n, mask, rows, m, logits, best);
  }

  void commit(const In& nodes) {
    const int64_t n = static_cast<int64_t>(nodes.size());
    engine_->commit(exact<int32_t>(nodes, static_cast<size_t>(n), "nodes"), n);
  }

  // Stream what the plan lists from its file (layers not listed stay resident, as set_matrix and
  // set_vector gave them).
  void set_streaming(const memory::StreamingPlan& plan) {
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
                                                            plan.slots, plan.staging_bytes, plan.prefetch);
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
  size_t staging_bytes() const { return streaming_ ? streaming_->staging_bytes() : 0; }

  void set_ffn_thresholds(std::vector<float> thresholds) { engine_->set_ffn_thresholds(std::move(thresholds)); }
  void set_arena_down_format(int64_t layer, const std::string& fmt) { engine_->set_arena_down_format(layer, fmt_of(fmt)); }
  // Tensor parallelism: `fn(point, layer, x)` sums x over the ranks in place (PyPartialSums).
  void set_partial_sums(nb::callable fn) {
    partial_sums_ = std::make_unique<PyPartialSums>(std::move(fn));
    engine_->set_partial_sums(partial_sums_.get());
  }

  int64_t truncate(int64_t n) { return engine_->truncate(n); }
  int64_t committed() const { return engine_->committed(); }
  EngineMemory memory() const { return engine_->memory(); }

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
      .def("set_head", &PyEngine::set_head)
      .def("set_output_norm", &PyEngine::set_output_norm)
      .def("set_head_shortlist", &PyEngine::set_head_shortlist)
      .def("set_matrix", &PyEngine::set_matrix, nb::arg("layer"), nb::arg("name"), nb::arg("raw"), nb::arg("fmt"),
           nb::arg("rows"), nb::arg("cols"), nb::arg("stride") = 0)
      .def("set_vector", &PyEngine::set_vector)
      .def("forward", &PyEngine::forward, nb::arg("tokens"), nb::arg("positions"), nb::arg("tree_mask").none(),
           nb::arg("logit_rows"), nb::arg("out"))
      .def("commit", &PyEngine::commit)
      .def("truncate", &PyEngine::truncate)
      .def("set_streaming", &PyEngine::set_streaming, nb::arg("plan"))
      .def("set_sparse_ffn", &PyEngine::set_sparse_ffn, nb::arg("layers"), nb::arg("gate"), nb::arg("up"),
           nb::arg("down"), nb::arg("capacity"), nb::arg("window"))
      .def("set_ffn_thresholds", &PyEngine::set_ffn_thresholds, nb::arg("thresholds"))
      .def("set_arena_down_format", &PyEngine::set_arena_down_format, nb::arg("layer"), nb::arg("fmt"))
      .def("set_partial_sums", &PyEngine::set_partial_sums, nb::arg("fn"))
      .def("reader_stats", &PyEngine::reader_stats)
      .def("stream_stats", &PyEngine::stream_stats)
      .def("neuron_stats", &PyEngine::neuron_stats)
      .def_prop_ro("staging_bytes", &PyEngine::staging_bytes)
      .def_prop_ro("neuron_cache_bytes", &PyEngine::neuron_cache_bytes)
      .def_prop_ro("committed", &PyEngine::committed)
      .def("memory", &PyEngine::memory);
}

}  // namespace ef::engine
