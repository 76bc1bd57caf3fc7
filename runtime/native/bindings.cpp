// Bindings for the native engine. The Python side (runtime/native_engine.py) builds it from a
// ModelSource; these functions check every buffer they receive and keep it alive for as long
// as the engine may read it.
#include "bindings.h"

#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/vector.h>

#include <chrono>
#include <map>
#include <memory>
#include <string>

#include "engine.h"
#include "neuron_cache.h"
#include "streaming.h"

namespace nb = nanobind;

namespace ef::engine {
namespace {

using In = nb::ndarray<nb::ro, nb::c_contig, nb::device::cpu>;
using Out = nb::ndarray<nb::c_contig, nb::device::cpu>;

Format format_named(const std::string& name) {
  Format f;
  if (!parse_format(name, &f)) throw KernelError("unknown weight format '" + name + "'");
  return f;
}

template <class T>
const T* typed(const In& a, size_t count, const char* what) {
  if (a.dtype() != nb::dtype<T>()) throw KernelError(std::string(what) + " has the wrong dtype");
  if (a.size() != count)
    throw KernelError(std::string(what) + " has " + std::to_string(a.size()) + " elements, expected " +
                      std::to_string(count));
  return static_cast<const T*>(a.data());
}

// Owns the engine, the resident layer table and references to every array it reads.
class PyEngine {
 public:
  PyEngine(const nb::dict& shape, const std::vector<nb::dict>& layers, int64_t context, int64_t max_batch,
           const std::string& kv_format, const std::string& activations, int64_t head_chunk)
      : layers_(nb::cast<int64_t>(shape["n_layers"])) {
    ModelShape s;
    s.n_layers = nb::cast<int64_t>(shape["n_layers"]);
    s.d_model = nb::cast<int64_t>(shape["d_model"]);
    s.n_heads = nb::cast<int64_t>(shape["n_heads"]);
    s.n_kv_heads = nb::cast<int64_t>(shape["n_kv_heads"]);
    s.head_dim = nb::cast<int64_t>(shape["head_dim"]);
    s.d_ff = nb::cast<int64_t>(shape["d_ff"]);
    s.vocab = nb::cast<int64_t>(shape["vocab"]);
    s.norm_eps = nb::cast<float>(shape["norm_eps"]);
    s.embedding_scale = nb::cast<float>(shape["embedding_scale"]);
    s.attn_scale = nb::cast<float>(shape["attn_scale"]);
    s.final_softcap = nb::cast<float>(shape["final_softcap"]);
    const std::string act = nb::cast<std::string>(shape["activation"]);
    if (act != "silu" && act != "gelu_tanh") throw KernelError("unknown activation '" + act + "'");
    s.act = act == "silu" ? Activation::silu : Activation::gelu_tanh;
    s.qk_norm = nb::cast<bool>(shape["qk_norm"]);
    s.sandwich_norm = nb::cast<bool>(shape["sandwich_norm"]);
    std::vector<LayerShape> ls;
    for (const nb::dict& d : layers) {
      LayerShape l;
      l.window = nb::cast<int64_t>(d["window"]);
      l.rot_dim = nb::cast<int64_t>(d["rot_dim"]);
      l.theta_base = nb::cast<float>(d["theta_base"]);
      l.freq_factors = nb::cast<std::vector<float>>(d["freq_factors"]);
      if (static_cast<int64_t>(l.freq_factors.size()) != l.rot_dim / 2)
        throw KernelError("freq_factors must have rot_dim / 2 entries");
      ls.push_back(std::move(l));
    }
    EngineOptions o;
    o.context = context;
    o.max_batch = max_batch;
    if (head_chunk < 1) throw KernelError("head_chunk must be at least 1 row");
    o.head_chunk = head_chunk;
    o.kv_format = format_named(kv_format);
    if (o.kv_format != Format::f16 && o.kv_format != Format::q8_0) throw KernelError("kv_format must be f16 or q8_0");
    if (activations == "q8") o.act_mode = ActMode::q8;
    else if (activations == "q8x2") o.act_mode = ActMode::q8x2;
    else if (activations == "f32") o.act_mode = ActMode::f32;
    else throw KernelError("activations must be q8, q8x2 or f32, got '" + activations + "'");
    engine_ = std::make_unique<Engine>(s, std::move(ls), o);
    engine_->set_layer_source(&layers_);
  }

  WeightMatrix matrix(const In& raw, const std::string& fmt, int64_t rows, int64_t cols) {
    const Format f = format_named(fmt);
    const size_t need = static_cast<size_t>(rows) * row_bytes(f, cols);
    if (raw.size() * raw.itemsize() != need)
      throw KernelError("weight buffer has " + std::to_string(raw.size() * raw.itemsize()) + " bytes, " +
                        std::to_string(rows) + " rows of " + fmt + " x " + std::to_string(cols) + " need " +
                        std::to_string(need));
    keep_.push_back(raw);
    return WeightMatrix{static_cast<const uint8_t*>(raw.data()), need, f, rows, cols, 0};
  }

  void set_embedding(const In& raw, const std::string& fmt, int64_t rows, int64_t cols) {
    check_dims(rows, engine_->shape().vocab, cols, engine_->shape().d_model, "embedding");
    engine_->set_embedding(matrix(raw, fmt, rows, cols));
  }

  void set_head(const In& raw, const std::string& fmt, int64_t rows, int64_t cols) {
    check_dims(rows, engine_->shape().vocab, cols, engine_->shape().d_model, "head");
    engine_->set_head(matrix(raw, fmt, rows, cols));
  }

  void set_head_shortlist(const In& raw, const std::string& fmt, const In& ids) {
    const int64_t k = static_cast<int64_t>(ids.size());
    const int32_t* p = typed<int32_t>(ids, static_cast<size_t>(k), "ids");
    keep_.push_back(ids);
    engine_->set_head_shortlist(matrix(raw, fmt, k, engine_->shape().d_model), std::vector<int32_t>(p, p + k));
  }

  void set_output_norm(const In& w) {
    keep_.push_back(w);
    engine_->set_output_norm(typed<float>(w, engine_->shape().d_model, "output_norm"));
  }

  // Rows and columns a layer tensor must have ({length, 1} for vectors), and its streaming target.
  std::pair<std::pair<int64_t, int64_t>, int> layer_tensor(const std::string& name) const {
    const ModelShape& s = engine_->shape();
    const int64_t qd = s.n_heads * s.head_dim, kd = s.n_kv_heads * s.head_dim;
    const std::map<std::string, std::pair<std::pair<int64_t, int64_t>, int>> table = {
        {"q", {{qd, s.d_model}, memory::kQ}}, {"k", {{kd, s.d_model}, memory::kK}},
        {"v", {{kd, s.d_model}, memory::kV}}, {"o", {{s.d_model, qd}, memory::kO}},
        {"gate", {{s.d_ff, s.d_model}, memory::kGate}}, {"up", {{s.d_ff, s.d_model}, memory::kUp}},
        {"down", {{s.d_model, s.d_ff}, memory::kDown}},
        {"pred_a", {{-1, s.d_model}, memory::kPredA}}, {"pred_b", {{s.d_ff, -1}, memory::kPredB}},
        {"attn_norm", {{s.d_model, 1}, memory::kAttnNorm}}, {"ffn_norm", {{s.d_model, 1}, memory::kFfnNorm}},
        {"post_attn_norm", {{s.d_model, 1}, memory::kPostAttnNorm}},
        {"post_ffn_norm", {{s.d_model, 1}, memory::kPostFfnNorm}},
        {"q_norm", {{s.head_dim, 1}, memory::kQNorm}}, {"k_norm", {{s.head_dim, 1}, memory::kKNorm}},
        {"q_bias", {{qd, 1}, memory::kQBias}}, {"k_bias", {{kd, 1}, memory::kKBias}},
        {"v_bias", {{kd, 1}, memory::kVBias}}};
    const auto it = table.find(name);
    if (it == table.end()) throw KernelError("unknown layer tensor '" + name + "'");
    return it->second;
  }

  void set_matrix(int64_t layer, const std::string& name, const In& raw, const std::string& fmt, int64_t rows,
                  int64_t cols) {
    const auto [dims, target] = layer_tensor(name);
    if (target > memory::kPredB) throw KernelError("'" + name + "' is a vector, not a matrix");
    check_dims(rows, dims.first, cols, dims.second, name.c_str());
    LayerWeights& w = layer_at(layer);
    WeightMatrix m = matrix(raw, fmt, rows, cols);
    WeightMatrix* slot[] = {&w.q, &w.k, &w.v, &w.o, &w.gate, &w.up, &w.down, &w.pred_a, &w.pred_b};
    const char* names[] = {"q", "k", "v", "o", "gate", "up", "down", "pred_a", "pred_b"};
    for (int i = 0; i < 9; ++i)
      if (name == names[i]) *slot[i] = m;
  }

  void set_vector(int64_t layer, const std::string& name, const In& values) {
    const ModelShape& s = engine_->shape();
    LayerWeights& w = layer_at(layer);
    const std::map<std::string, std::pair<const float**, int64_t>> vectors = {
        {"attn_norm", {&w.attn_norm, s.d_model}}, {"ffn_norm", {&w.ffn_norm, s.d_model}},
        {"post_attn_norm", {&w.post_attn_norm, s.d_model}}, {"post_ffn_norm", {&w.post_ffn_norm, s.d_model}},
        {"q_norm", {&w.q_norm, s.head_dim}}, {"k_norm", {&w.k_norm, s.head_dim}},
        {"q_bias", {&w.q_bias, s.n_heads * s.head_dim}}, {"k_bias", {&w.k_bias, s.n_kv_heads * s.head_dim}},
        {"v_bias", {&w.v_bias, s.n_kv_heads * s.head_dim}}};
    const auto it = vectors.find(name);
    if (it == vectors.end()) throw KernelError("unknown layer vector '" + name + "'");
    keep_.push_back(values);
    *it->second.first = typed<float>(values, static_cast<size_t>(it->second.second), name.c_str());
  }

  // `out`: float32 [len(logit_rows), vocab] logits, or int32 [len(logit_rows)] for the argmax only.
  void forward(const In& tokens, const In& positions, nb::object tree_mask, const In& logit_rows, Out logits) {
    const int64_t n = static_cast<int64_t>(tokens.size());
    const int32_t* tok = typed<int32_t>(tokens, n, "tokens");
    const int32_t* pos = typed<int32_t>(positions, n, "positions");
    const int64_t m = static_cast<int64_t>(logit_rows.size());
    const int32_t* rows = typed<int32_t>(logit_rows, m, "logit_rows");
    const bool argmax = logits.dtype() == nb::dtype<int32_t>();
    if (argmax ? logits.size() != static_cast<size_t>(m)
               : (logits.dtype() != nb::dtype<float>() || logits.size() != static_cast<size_t>(m * engine_->shape().vocab)))
      throw KernelError("out must be float32 [len(logit_rows), vocab] or int32 [len(logit_rows)]");
    const uint8_t* mask = nullptr;
    In mask_array;
    if (!tree_mask.is_none()) {
      mask_array = nb::cast<In>(tree_mask);
      mask = typed<uint8_t>(mask_array, static_cast<size_t>(n * n), "tree_mask");
    }
    float* out = argmax ? nullptr : static_cast<float*>(logits.data());
    int32_t* best = argmax ? static_cast<int32_t*>(logits.data()) : nullptr;
    nb::gil_scoped_release release;
    engine_->forward(tok, pos, n, mask, rows, m, out, best);
  }

  void commit(const In& nodes) {
    const int64_t n = static_cast<int64_t>(nodes.size());
    engine_->commit(typed<int32_t>(nodes, n, "nodes"), n);
  }

  // Stream the listed units from `path` (layers not listed stay resident, as set_matrix/set_vector
  // gave them). A unit: {"layer": i | "head_chunk": c, "row0": r, "ranges": [(offset, bytes)],
  // "tensors": [{"target", "offset", "fmt", "rows", "cols"}]}. `embedding`: {"offset", "fmt",
  // "rows", "cols"} to read embedding rows on demand, or None for the resident table.
  // `staging_bytes`: the staging slots' arena (0: just the slots).
  void set_streaming(const std::string& path, bool direct, int io_threads, int64_t chunk_bytes,
                     const std::vector<nb::dict>& units, int slots, bool prefetch, nb::object embedding,
                     int64_t staging_bytes) {
    if (staging_bytes < 0) throw KernelError("staging_bytes must be >= 0");
    const ModelShape& s = engine_->shape();
    std::vector<memory::StreamUnit> plan;
    for (const nb::dict& d : units) {
      memory::StreamUnit u;
      if (d.contains("layer")) {
        u.layer = nb::cast<int64_t>(d["layer"]);
      } else {
        u.head_chunk = nb::cast<int64_t>(d["head_chunk"]);
        u.head_row0 = nb::cast<int64_t>(d["row0"]);
      }
      for (const auto& r : nb::cast<std::vector<std::pair<int64_t, int64_t>>>(d["ranges"]))
        u.ranges.emplace_back(r.first, static_cast<size_t>(r.second));
      size_t unit_bytes = u.bytes();
      for (const nb::handle h : nb::cast<nb::list>(d["tensors"])) {
        const nb::dict t = nb::cast<nb::dict>(h);
        memory::StreamedTensor st;
        const std::string target = nb::cast<std::string>(t["target"]);
        st.offset = nb::cast<size_t>(t["offset"]);
        st.fmt = format_named(nb::cast<std::string>(t["fmt"]));
        st.rows = nb::cast<int64_t>(t["rows"]);
        st.cols = nb::cast<int64_t>(t["cols"]);
        if (u.layer >= 0) {
          const auto [dims, tgt] = layer_tensor(target);
          check_dims(st.rows, dims.first, st.cols, dims.second, target.c_str());
          st.target = tgt;
        } else {
          if (target != "head") throw KernelError("a head chunk streams the target 'head'");
          if (st.cols != s.d_model || st.rows < 1 || u.head_row0 < 0 || u.head_row0 + st.rows > s.vocab)
            throw KernelError("head chunk rows or columns do not fit the model");
        }
        const size_t need = static_cast<size_t>(st.rows) * row_bytes(st.fmt, st.cols);
        if (st.target > memory::kPredB && st.fmt != Format::f32) throw KernelError("streamed vectors must be f32");
        if (st.offset % 4 || st.offset + need > unit_bytes)
          throw KernelError("streamed tensor '" + target + "' lies outside its unit's bytes");
        u.tensors.push_back(st);
      }
      plan.push_back(std::move(u));
    }
    reader_ = std::make_shared<memory::DirectReader>(path, direct, io_threads, static_cast<size_t>(chunk_bytes));
    streaming_ = std::make_unique<memory::StreamingWeights>(reader_, &layers_, s.n_layers, std::move(plan), slots,
                                                            static_cast<size_t>(staging_bytes), prefetch);
    engine_->set_layer_source(streaming_.get());
    engine_->set_head_source(streaming_->streams_head() ? streaming_.get() : nullptr);
    if (!embedding.is_none()) {
      const nb::dict e = nb::cast<nb::dict>(embedding);
      const int64_t rows = nb::cast<int64_t>(e["rows"]), cols = nb::cast<int64_t>(e["cols"]);
      check_dims(rows, s.vocab, cols, s.d_model, "embedding");
      embedding_ = std::make_unique<memory::StreamedEmbedding>(reader_, nb::cast<int64_t>(e["offset"]),
                                                               format_named(nb::cast<std::string>(e["fmt"])), rows, cols);
      engine_->set_embedding_source(embedding_.get());
    }
  }

  // Approximate feed-forward for every layer: per layer {"arena_offset", "stride", "order" (slot ->
  // neuron), "pred_threshold", "gate_threshold"}; bundles of `formats` (gate, up, down). The
  // predictors are layer tensors ("pred_a", "pred_b"). Needs set_streaming first (its reader).
  void set_sparse_ffn(const std::vector<nb::dict>& layers, const std::vector<std::string>& formats, int64_t capacity,
                      int64_t window) {
    const ModelShape& s = engine_->shape();
    if (!reader_) throw KernelError("set_sparse_ffn needs set_streaming first");
    if (static_cast<int64_t>(layers.size()) != s.n_layers) throw KernelError("one sparse spec per layer is needed");
    if (formats.size() != 3) throw KernelError("formats must be [gate, up, down]");
    std::vector<memory::SparseLayerSpec> specs;
    for (const nb::dict& d : layers) {
      memory::SparseLayerSpec l;
      l.arena_offset = nb::cast<int64_t>(d["arena_offset"]);
      l.stride = nb::cast<size_t>(d["stride"]);
      const std::vector<int32_t> order = nb::cast<std::vector<int32_t>>(d["order"]);
      l.n_neurons = static_cast<int64_t>(order.size());
      if (l.n_neurons != s.d_ff) throw KernelError("the arena must hold d_ff neurons");
      l.file_slot_of_neuron.assign(order.size(), -1);
      for (size_t j = 0; j < order.size(); ++j) {
        if (order[j] < 0 || order[j] >= l.n_neurons || l.file_slot_of_neuron[order[j]] >= 0)
          throw KernelError("arena order is not a permutation of the neurons");
        l.file_slot_of_neuron[order[j]] = static_cast<int32_t>(j);
      }
      l.pred_threshold = nb::cast<float>(d["pred_threshold"]);
      l.gate_threshold = nb::cast<float>(d["gate_threshold"]);
      specs.push_back(std::move(l));
    }
    sparse_ = std::make_unique<memory::NeuronCacheFfn>(reader_, std::move(specs), s.d_model, format_named(formats[0]),
                                                       format_named(formats[1]), format_named(formats[2]), s.act,
                                                       capacity, window);
    engine_->set_ffn_hook(sparse_.get());
  }

  nb::dict neuron_stats() const {
    nb::dict d;
    if (!sparse_) return d;
    const memory::NeuronCacheStats st = sparse_->stats();
    d["lookups"] = st.lookups;
    d["hits"] = st.hits;
    d["loaded"] = st.loaded;
    d["evicted"] = st.evicted;
    d["bytes_read"] = st.bytes_read;
    d["predicted"] = st.predicted;
    d["tokens"] = st.tokens;
    d["passes"] = st.passes;
    d["cache_bytes"] = sparse_->cache_bytes();
    return d;
  }

  nb::dict io_stats() const {
    nb::dict d;
    if (!reader_) return d;
    const memory::ReaderStats r = reader_->stats();
    const memory::StreamStats st = streaming_->stats();
    d["bytes_read"] = r.bytes_read;
    d["read_requests"] = r.requests;
    d["io_wait_s"] = static_cast<double>(r.wait_ns) * 1e-9;
    d["passes"] = st.passes;
    d["units_read"] = st.units_read;
    d["prefetched_units"] = st.prefetched_hits;
    d["staging_bytes"] = streaming_->staging_bytes();
    d["direct_io"] = reader_->direct();
    return d;
  }

  int64_t truncate(int64_t n) { return engine_->truncate(n); }
  int64_t committed() const { return engine_->committed(); }

  nb::dict memory() const {
    const EngineMemory m = engine_->memory();
    nb::dict d;
    d["kv_cache"] = m.kv_cache;
    d["activations"] = m.activations;
    return d;
  }

 private:
  LayerWeights& layer_at(int64_t layer) {
    if (layer < 0 || layer >= engine_->shape().n_layers) throw KernelError("layer index out of range");
    return layers_.at(layer);
  }

  // want_* of -1: any positive size (a predictor's rank).
  static void check_dims(int64_t rows, int64_t want_rows, int64_t cols, int64_t want_cols, const char* what) {
    const bool rows_ok = want_rows < 0 ? rows > 0 : rows == want_rows;
    const bool cols_ok = want_cols < 0 ? cols > 0 : cols == want_cols;
    if (!rows_ok || !cols_ok)
      throw KernelError(std::string(what) + " is " + std::to_string(rows) + " x " + std::to_string(cols) +
                        ", the model needs " + std::to_string(want_rows) + " x " + std::to_string(want_cols));
  }

  ResidentLayers layers_;
  std::shared_ptr<memory::DirectReader> reader_;
  std::unique_ptr<memory::StreamingWeights> streaming_;
  std::unique_ptr<memory::StreamedEmbedding> embedding_;
  std::unique_ptr<memory::NeuronCacheFfn> sparse_;
  std::unique_ptr<Engine> engine_;  // declared last: destroyed first, before what it reads
  std::vector<In> keep_;  // every array the engine reads stays alive with it
};

}  // namespace

// Reads `total` bytes of `path` from `offset` in `chunk` pieces on `threads` I/O threads (one
// request per chunk, all in flight) and returns the seconds taken: the probe behind
// `edgeflash probe-io`.
double probe_read(const std::string& path, bool direct, int threads, int64_t chunk, int64_t offset, int64_t total) {
  memory::DirectReader reader(path, direct, threads, static_cast<size_t>(chunk));
  memory::AlignedBuffer buf(static_cast<size_t>(std::min<int64_t>(total, 64 << 20)));
  nb::gil_scoped_release release;
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t done = 0; done < total;) {
    const int64_t n = std::min<int64_t>(static_cast<int64_t>(buf.size()), total - done);
    reader.wait(reader.submit(offset + done, static_cast<size_t>(n), buf.data()));
    done += n;
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void register_engine(nb::module_& m) {
  m.def("read_pieces", &memory::split_request, nb::arg("n"), nb::arg("chunk_bytes"),
        "The byte counts a streamed read of n bytes is split into, one per I/O request.");
  m.def("probe_read", &probe_read, nb::arg("path"), nb::arg("direct"), nb::arg("threads"), nb::arg("chunk"),
        nb::arg("offset"), nb::arg("total"));
  nb::class_<PyEngine>(m, "Engine")
      .def(nb::init<const nb::dict&, const std::vector<nb::dict>&, int64_t, int64_t, const std::string&,
                    const std::string&, int64_t>(),
           nb::arg("shape"), nb::arg("layers"), nb::arg("context"), nb::arg("max_batch"), nb::arg("kv_format"),
           nb::arg("activations"), nb::arg("head_chunk"))
      .def("set_embedding", &PyEngine::set_embedding)
      .def("set_head", &PyEngine::set_head)
      .def("set_output_norm", &PyEngine::set_output_norm)
      .def("set_head_shortlist", &PyEngine::set_head_shortlist)
      .def("set_matrix", &PyEngine::set_matrix)
      .def("set_vector", &PyEngine::set_vector)
      .def("forward", &PyEngine::forward, nb::arg("tokens"), nb::arg("positions"), nb::arg("tree_mask").none(),
           nb::arg("logit_rows"), nb::arg("logits"))
      .def("set_streaming", &PyEngine::set_streaming, nb::arg("path"), nb::arg("direct"), nb::arg("io_threads"),
           nb::arg("chunk_bytes"), nb::arg("units"), nb::arg("slots"), nb::arg("prefetch"),
           nb::arg("embedding").none(), nb::arg("staging_bytes") = 0)
      .def("io_stats", &PyEngine::io_stats)
      .def("set_sparse_ffn", &PyEngine::set_sparse_ffn, nb::arg("layers"), nb::arg("formats"), nb::arg("capacity"),
           nb::arg("window"))
      .def("neuron_stats", &PyEngine::neuron_stats)
      .def("commit", &PyEngine::commit)
      .def("truncate", &PyEngine::truncate)
      .def_prop_ro("committed", &PyEngine::committed)
      .def("memory", &PyEngine::memory);
}

}  // namespace ef::engine
