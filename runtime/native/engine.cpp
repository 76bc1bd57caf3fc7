#include "engine.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <string>

namespace ef::engine {
namespace {

KernelError engine_error(const std::string& what) { return KernelError("engine: " + what); }

bool quantized(const WeightMatrix& w) { return format_info(w.fmt).quantized; }

void add_into(float* x, const float* y, int64_t count) {
  for (int64_t i = 0; i < count; ++i) x[i] += y[i];
}

void add_bias(float* y, const float* bias, int64_t n, int64_t dim) {
  if (!bias) return;
  for (int64_t t = 0; t < n; ++t)
    for (int64_t i = 0; i < dim; ++i) y[t * dim + i] += bias[i];
}

}  // namespace

KvCache Engine::LayerCache::view() {
  KvCache c;
  c.k = k.data();
  c.v = v.data();
  c.size_bytes = k.size();
  c.v_size_bytes = v.size();
  c.capacity = capacity;
  c.slot_pos = slot_pos.data();
  c.sealed = &sealed;
  c.wraps = wraps;
  return c;
}

std::pair<int64_t, int64_t> slot_dims(const ModelShape& s, Slot slot) {
  const int64_t qd = s.n_heads * s.head_dim, kd = s.n_kv_heads * s.head_dim;
  switch (slot) {
    case Slot::q: return {qd, s.d_model};
    case Slot::k: case Slot::v: return {kd, s.d_model};
    case Slot::o: return {s.d_model, qd};
    case Slot::gate: case Slot::up: return {s.d_ff, s.d_model};
    case Slot::down: return {s.d_model, s.d_ff};
    case Slot::pred_a: return {-1, s.d_model};
    case Slot::pred_b: return {s.d_ff, -1};
    case Slot::ffn_arena: return {s.d_ff, s.d_model};
    case Slot::attn_norm: case Slot::ffn_norm: case Slot::post_attn_norm: case Slot::post_ffn_norm:
      return {s.d_model, 1};
    case Slot::q_norm: case Slot::k_norm: return {s.head_dim, 1};
    case Slot::q_bias: return {qd, 1};
    case Slot::k_bias: case Slot::v_bias: return {kd, 1};
    default: throw engine_error("unknown layer slot");
  }
}

BufferSizes buffer_sizes(const ModelShape& shape, const std::vector<LayerShape>& layers, const EngineOptions& options) {
  BufferSizes z;
  const int64_t b = options.max_batch;
  int64_t max_capacity = 0;
  for (const LayerShape& ls : layers) {
    // A sliding layer keeps its window plus room for one batch of new tokens (a ring buffer).
    const int64_t cap = kv_capacity(options.kv_format, ls.window ? std::min(options.context, ls.window + b)
                                                                 : options.context);
    z.kv_capacity.push_back(cap);
    z.kv_bytes.push_back(kv_cache_bytes(options.kv_format, shape.n_kv_heads, cap, shape.head_dim, cap < options.context));
    max_capacity = std::max(max_capacity, cap);
  }
  z.x = b * shape.d_model;
  z.q = b * shape.n_heads * shape.head_dim;
  z.kv = b * shape.n_kv_heads * shape.head_dim;
  z.ffn = b * shape.d_ff;
  z.max_cols = std::max({shape.d_model, shape.n_heads * shape.head_dim, shape.d_ff});
  const int64_t head_rows = std::min(shape.vocab, std::max(options.head_chunk, kPanelRows));  // panels: >= 16
  const int64_t qkv_rows = shape.n_heads * shape.head_dim + 2 * shape.n_kv_heads * shape.head_dim;
  const int64_t max_rows = std::max({z.max_cols, head_rows, qkv_rows, 2 * shape.d_ff});  // q8x2: one pass
  z.act2 = 2 * b * z.max_cols;  // q8x2: activations and their residuals
  z.out2 = 2 * b * max_rows;
  z.head_part = b * head_rows;
  z.mask = b * max_capacity;
  z.quantized_acts = QuantizedActs::bytes_for(2 * b, z.max_cols);
  return z;
}

EngineMemory plan_memory(const ModelShape& shape, const std::vector<LayerShape>& layers, const EngineOptions& options) {
  const BufferSizes z = buffer_sizes(shape, layers, options);
  EngineMemory m;
  for (size_t l = 0; l < z.kv_capacity.size(); ++l)
    m.kv_cache += z.kv_bytes[l] + static_cast<size_t>(z.kv_capacity[l]) * sizeof(int32_t);
  // x, h, sel: [b, d_model]; q, attn: [b, q]; k, v: [b, kv]; gate, up: [b, d_ff]; slots: [b] int32
  const int64_t floats = 3 * z.x + 2 * z.q + 2 * z.kv + 2 * z.ffn + z.act2 + z.out2 + z.head_part;
  m.activations = static_cast<size_t>(floats) * sizeof(float) + static_cast<size_t>(z.mask) + z.quantized_acts +
                  static_cast<size_t>(options.max_batch + shape.d_ff) * sizeof(int32_t);
  return m;
}

Engine::Engine(const ModelShape& shape, std::vector<LayerShape> layers, const EngineOptions& options)
    : shape_(shape), layer_shapes_(std::move(layers)), options_(options) {
  if (static_cast<int64_t>(layer_shapes_.size()) != shape_.n_layers)
    throw engine_error("got " + std::to_string(layer_shapes_.size()) + " layer shapes for " +
                       std::to_string(shape_.n_layers) + " layers");
  if (options_.max_batch < 1 || options_.context < 2) throw engine_error("max_batch >= 1 and context >= 2 are required");
  if (options_.head_chunk < 1) throw engine_error("head_chunk must be at least 1 row");
  if (options_.kv_format != Format::f16 && options_.kv_format != Format::q8_0 && options_.kv_format != Format::kivi2)
    throw engine_error("the KV cache format must be f16, q8_0 or kivi2");
  if (shape_.n_heads % shape_.n_kv_heads) throw engine_error("n_heads must be a multiple of n_kv_heads");
  if (shape_.vocab_begin == 0 && shape_.vocab_end == 0) shape_.vocab_end = shape_.vocab;
  if (shape_.vocab_begin < 0 || shape_.vocab_begin >= shape_.vocab_end || shape_.vocab_end > shape_.vocab)
    throw engine_error("the vocabulary rows [" + std::to_string(shape_.vocab_begin) + ", " +
                       std::to_string(shape_.vocab_end) + ") are not inside 0.." + std::to_string(shape_.vocab));
  // Every buffer the forward pass may use, allocated now with the sizes plan_memory counts:
  // nothing grows while the model runs (a budgeted run plans with these numbers).
  const BufferSizes z = buffer_sizes(shape_, layer_shapes_, options_);
  for (size_t l = 0; l < z.kv_capacity.size(); ++l) {
    LayerCache c;
    const int64_t cap = z.kv_capacity[l];
    c.capacity = cap;
    c.wraps = cap < options_.context;
    c.k.assign(kv_key_bytes(options_.kv_format, shape_.n_kv_heads, cap, shape_.head_dim, c.wraps), 0);
    c.v.assign(z.kv_bytes[l] - c.k.size(), 0);
    c.slot_pos.assign(static_cast<size_t>(cap), -1);
    caches_.push_back(std::move(c));
  }
  for (auto* buf : {&x_, &h_, &sel_}) buf->resize(z.x);
  for (auto* buf : {&q_, &attn_}) buf->resize(z.q);
  for (auto* buf : {&k_, &v_}) buf->resize(z.kv);
  for (auto* buf : {&gate_, &up_}) buf->resize(z.ffn);
  slots_.resize(options_.max_batch);
  arena_down_.assign(static_cast<size_t>(shape_.n_layers), -1);
  all_neurons_.resize(static_cast<size_t>(shape_.d_ff));
  for (int64_t i = 0; i < shape_.d_ff; ++i) all_neurons_[i] = static_cast<int32_t>(i);
  act2_.assign(z.act2, 0.0f);
  out2_.resize(z.out2);
  out2_capacity_ = z.out2;
  head_part_.resize(z.head_part);
  mask_.reserve(z.mask);
  xq_.quantize(act2_.data(), 2 * options_.max_batch, z.max_cols);  // sizes the quantized-activation buffers
}

EngineMemory Engine::memory() const { return plan_memory(shape_, layer_shapes_, options_); }

void Engine::linear(const WeightMatrix& w, const float* x, QuantizedActs& xq, bool xq_ready, int64_t n, float* y) {
  linear_multi(&w, &y, 1, x, xq, xq_ready, n);
}

void Engine::linear_multi(const WeightMatrix* ws, float* const* ys, int count, const float* x, QuantizedActs& xq,
                          bool xq_ready, int64_t n) {
  bool all_quantized = true;
  for (int i = 0; i < count; ++i) all_quantized &= quantized(ws[i]);
  if (options_.act_mode == ActMode::f32) {
    for (int i = 0; i < count; ++i) matmul(ws[i], x, n, ys[i], ActPrecision::f32);
    return;
  }
  if (!all_quantized && count > 1) {  // float matrices among them: one at a time
    for (int i = 0; i < count; ++i) linear_multi(ws + i, ys + i, 1, x, xq, false, n);
    return;
  }
  if (!all_quantized) {
    matmul(ws[0], x, n, ys[0], ActPrecision::f32);
    return;
  }
  const int64_t cols = ws[0].cols;
  if (options_.act_mode == ActMode::q8) {
    if (!xq_ready || xq.cols() != cols || xq.n() != n) xq.quantize(x, n, cols);
    matmul_multi(ws, ys, count, xq);
    return;
  }
  // q8x2: rows [0, n) are x, rows [n, 2n) the residual x - dequant(Q8(x)); one GEMM over both.
  if (!xq_ready || xq.cols() != cols || xq.n() != 2 * n) {
    act2_.resize(static_cast<size_t>(2 * n * cols));
    std::memcpy(act2_.data(), x, static_cast<size_t>(n * cols) * sizeof(float));
    xq.quantize(x, n, cols);
    const int8_t* q = xq.q();
    const float* d = xq.d();
    float* r = act2_.data() + n * cols;
    for (int64_t i = 0; i < n * cols; ++i) r[i] = x[i] - d[i / 32] * static_cast<float>(q[i]);
    xq.quantize(act2_.data(), 2 * n, cols);
  }
  int64_t total = 0;
  for (int i = 0; i < count; ++i) total += ws[i].rows;
  out2_.resize(static_cast<size_t>(2 * n * total));
  float* outs[8];
  for (int i = 0, at = 0; i < count; at += static_cast<int>(2 * n * ws[i].rows), ++i) outs[i] = out2_.data() + at;
  matmul_multi(ws, outs, count, xq);
  for (int i = 0; i < count; ++i) {
    const float* lo = outs[i];
    const float* hi = outs[i] + n * ws[i].rows;
    for (int64_t j = 0; j < n * ws[i].rows; ++j) ys[i][j] = lo[j] + hi[j];
  }
}

// The dense FFN read from a bundle's one copy of it, the neuron arena: the sparse-FFN kernel over
// every neuron, with no threshold, computes exactly sum_n act(gate_n . x) (up_n . x) down_n.
// The down columns' product at the activation mode's precision where the level has an int8 product
// for their format (q8_0 on AVX-512 VNNI), else in float.
ColumnActs Engine::column_acts(Format fmt) const {
  if (options_.act_mode == ActMode::f32 || !prefers_int8_columns(fmt)) return ColumnActs::f32;
  return options_.act_mode == ActMode::q8 ? ColumnActs::q8 : ColumnActs::q8x2;
}

void Engine::set_ffn_thresholds(std::vector<float> thresholds) {
  if (!thresholds.empty() && static_cast<int64_t>(thresholds.size()) != shape_.n_layers)
    throw engine_error("FFN thresholds: one per layer is needed");
  ffn_thresholds_ = std::move(thresholds);
  token_thresholds_.assign(static_cast<size_t>(options_.max_batch), 0.0f);
}

void Engine::set_arena_down_format(int64_t layer, Format fmt) {
  if (layer < 0 || layer >= shape_.n_layers) throw engine_error("arena down format: layer out of range");
  arena_down_[layer] = static_cast<int>(fmt);
}

void Engine::arena_parts(int64_t layer, const WeightMatrix& a, WeightMatrix* gate_up, WeightMatrix* down) const {
  if (a.rows != shape_.d_ff || a.cols != shape_.d_model || !a.stride)
    throw engine_error("an FFN arena must hold d_ff neuron bundles of d_model values with a stride");
  const size_t rb = row_bytes(a.fmt, a.cols);
  const Format fd = arena_down_format(layer, a.fmt);
  if (a.size_bytes < static_cast<size_t>(a.rows - 1) * a.stride + 2 * rb + row_bytes(fd, a.cols))
    throw engine_error("an FFN arena is smaller than its neuron bundles");
  gate_up[0] = WeightMatrix{a.data, a.size_bytes, a.fmt, a.rows, a.cols, a.stride};
  gate_up[1] = WeightMatrix{a.data + rb, a.size_bytes - rb, a.fmt, a.rows, a.cols, a.stride};
  *down = WeightMatrix{a.data + 2 * rb, a.size_bytes - 2 * rb, fd, a.rows, a.cols, a.stride};
}

void Engine::ffn_from_arena(int64_t layer, const WeightMatrix& w, const float* x, int64_t n, float* out) {
  if (w.rows != shape_.d_ff || w.cols != shape_.d_model || !w.stride)
    throw engine_error("an FFN arena must hold d_ff neuron bundles of d_model values with a stride");
  NeuronArena a;
  a.data = w.data;
  a.size_bytes = w.size_bytes;
  a.n_slots = w.rows;
  a.d_model = w.cols;
  a.gate = a.up = w.fmt;
  a.down = arena_down_[layer] < 0 ? w.fmt : static_cast<Format>(arena_down_[layer]);
  a.stride = w.stride;
  const float* thresholds = nullptr;
  if (!ffn_thresholds_.empty() && ffn_thresholds_[layer] > 0.0f) {
    std::fill(token_thresholds_.begin(), token_thresholds_.begin() + n, ffn_thresholds_[layer]);
    thresholds = token_thresholds_.data();
  }
  ffn_sparse(a, x, n, all_neurons_.data(), w.rows, shape_.act, thresholds, out, false);
}

void Engine::build_attention_mask(int64_t layer, int64_t n, int64_t base, const uint8_t* tree_mask) {
  // Committed slots are visible (the kernel still applies causality and the window); among the
  // tree's tokens (the `base` of earlier calls, then the new ones) only the tree's ancestors are.
  LayerCache& c = caches_[layer];
  const int64_t width = base + n;
  mask_.assign(static_cast<size_t>(n * c.capacity), 1);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < width; ++j)
      mask_[i * c.capacity + (committed_ + j) % c.capacity] = tree_mask[i * width + j] ? 1 : 0;
}

void Engine::check_part(int64_t layer, const LayerWeights& w, LayerPart part) const {
  const ModelShape& s = shape_;
  const bool ffn_elsewhere = (ffn_hook_ && ffn_hook_->active(layer)) || w.ffn_arena.data;
  std::pair<const WeightMatrix*, const char*> matrices[4];
  int count = 0;
  bool missing_norm = false;
  switch (part) {
    case LayerPart::attention:
      for (const auto& m : {std::pair{&w.q, "q"}, {&w.k, "k"}, {&w.v, "v"}, {&w.o, "o"}}) matrices[count++] = m;
      missing_norm = !w.attn_norm || (s.qk_norm && (!w.q_norm || !w.k_norm)) || (s.sandwich_norm && !w.post_attn_norm);
      break;
    case LayerPart::ffn_in:
      if (!ffn_elsewhere) matrices[count++] = {&w.gate, "gate"};
      missing_norm = !w.ffn_norm;
      break;
    case LayerPart::ffn_up:
      if (!ffn_elsewhere) matrices[count++] = {&w.up, "up"};
      break;
    default:
      if (!ffn_elsewhere && !w.down_columns.data) matrices[count++] = {&w.down, "down"};
      missing_norm = s.sandwich_norm && !w.post_ffn_norm;
  }
  for (int i = 0; i < count; ++i)
    if (!matrices[i].first->data)
      throw engine_error("layer " + std::to_string(layer) + " has no " + matrices[i].second + " weights");
  if (missing_norm) throw engine_error("layer " + std::to_string(layer) + " is missing a norm weight");
}

void Engine::part_ready(int64_t layer, LayerPart part) {
  OpTimer timer(prof(), Op::weights_wait);
  source_->ready(layer, part);
}

void Engine::run_block(int64_t layer, const LayerWeights& w, int64_t n, const int32_t* positions,
                       const int32_t* slots, const uint8_t* attn_mask) {
  const ModelShape& s = shape_;
  check_part(layer, w, LayerPart::attention);
  const LayerShape& ls = layer_shapes_[layer];
  const int64_t d = s.d_model, qd = s.n_heads * s.head_dim, kd = s.n_kv_heads * s.head_dim;
  float* x = x_.data();
  float* h = h_.data();

  // Attention: h = norm(x); q, k, v share one quantization of h.
  rms_norm(x, w.attn_norm, h, n, d, s.norm_eps);
  {
    OpTimer timer(prof(), Op::gemv_qkv);
    const WeightMatrix qkv[3] = {w.q, w.k, w.v};
    float* const out[3] = {q_.data(), k_.data(), v_.data()};
    linear_multi(qkv, out, 3, h, xq_, false, n);
  }
  add_bias(q_.data(), w.q_bias, n, qd);
  add_bias(k_.data(), w.k_bias, n, kd);
  add_bias(v_.data(), w.v_bias, n, kd);
  if (s.qk_norm) {
    rms_norm(q_.data(), w.q_norm, q_.data(), n * s.n_heads, s.head_dim, s.norm_eps);
    rms_norm(k_.data(), w.k_norm, k_.data(), n * s.n_kv_heads, s.head_dim, s.norm_eps);
  }
  RopeParams rp;
  rp.rot_dim = ls.rot_dim;
  rp.theta_base = ls.theta_base;
  rp.freq_factors = ls.freq_factors.empty() ? nullptr : ls.freq_factors.data();
  rope(q_.data(), n, s.n_heads, s.head_dim, positions, rp);
  rope(k_.data(), n, s.n_kv_heads, s.head_dim, positions, rp);

  std::optional<OpTimer> attention_timer(std::in_place, prof(), Op::attention);
  KvCache cache = caches_[layer].view();
  cache.fmt = options_.kv_format;
  cache.n_kv_heads = s.n_kv_heads;
  cache.head_dim = s.head_dim;
  cache.rope = rp;  // kivi2 keeps its 2-bit keys unrotated
  kv_write(cache, k_.data(), v_.data(), n, slots, positions);
  AttentionArgs a;
  a.q = q_.data();
  a.n_q = n;
  a.n_heads = s.n_heads;
  a.q_pos = positions;
  a.window = ls.window;
  a.mask = attn_mask;
  a.scale = s.attn_scale;
  a.out = attn_.data();
  attention(cache, a);
  attention_timer.reset();
  {
    OpTimer timer(prof(), Op::gemv_o);
    linear(w.o, attn_.data(), xq_, false, n, h);
  }
  complete(PartialSums::Point::attention, layer, h, n * d);
  if (s.sandwich_norm) rms_norm(h, w.post_attn_norm, h, n, d, s.norm_eps);
  source_->done(layer, LayerPart::attention);
  add_into(x, h, n * d);

  // Feed-forward: gate and up share one quantization of norm(x). The dense FFN moves on to up when
  // it is read as a part of its own, and to its output part (down) once gate and up are done; an
  // arena or the hook reads only the input part.
  part_ready(layer, LayerPart::ffn_in);
  check_part(layer, w, LayerPart::ffn_in);
  const auto to_part = [&](LayerPart done, LayerPart next) {
    source_->done(layer, done);
    part_ready(layer, next);
    check_part(layer, w, next);
  };
  bool output_ready = false;
  const auto to_output_part = [&] {
    to_part(LayerPart::ffn_up, LayerPart::ffn_out);  // done with the input side and up
    output_ready = true;
  };
  rms_norm(x, w.ffn_norm, h, n, d, s.norm_eps);
  if (ffn_hook_ && ffn_hook_->active(layer)) {
    OpTimer timer(prof(), Op::ffn_hook);
    ffn_hook_->compute(layer, w, h, n, sel_.data());  // sel_ is free until the logits
    std::memcpy(h, sel_.data(), static_cast<size_t>(n * d) * sizeof(float));
  } else if (w.ffn_arena.data && !ffn_thresholds_.empty() && ffn_thresholds_[layer] > 0.0f) {
    OpTimer timer(prof(), Op::ffn_arena);  // neurons below the activation threshold skipped: the sparse kernel
    ffn_from_arena(layer, w.ffn_arena, h, n, sel_.data());
    std::memcpy(h, sel_.data(), static_cast<size_t>(n * d) * sizeof(float));
  } else if (w.ffn_arena.data) {
    // A bundle's one copy of the FFN, laid out at load (gate and up in panels, down columns in rows
    // of their own) or read in place (strided rows of the arena): gate and up in one pass on int8
    // activations, then the down columns' product. Both give the same numbers (the row and panel
    // kernels run the same arithmetic), so a streamed arena equals a resident one.
    WeightMatrix gate_up[2] = {w.gate, w.up};
    WeightMatrix down = w.down_columns;
    if (!down.data) arena_parts(layer, w.ffn_arena, gate_up, &down);
    {
      OpTimer timer(prof(), Op::gemv_ffn_in);
      float* const out[2] = {gate_.data(), up_.data()};
      linear_multi(gate_up, out, 2, h, xq_, false, n);
    }
    {
      OpTimer timer(prof(), Op::ffn_act);
      gated_act(gate_.data(), up_.data(), gate_.data(), n * s.d_ff, s.act);
    }
    OpTimer timer(prof(), Op::gemv_ffn_down);
    matmul_columns(down, gate_.data(), n, h, column_acts(down.fmt));
  } else {
    if (w.up.data) {  // gate and up at hand: one pass over both
      OpTimer timer(prof(), Op::gemv_ffn_in);
      const WeightMatrix gate_up[2] = {w.gate, w.up};
      float* const out[2] = {gate_.data(), up_.data()};
      linear_multi(gate_up, out, 2, h, xq_, false, n);
    } else {  // up is read after gate, as a part of its own: the same numbers, row by row
      {
        OpTimer timer(prof(), Op::gemv_ffn_in);
        linear(w.gate, h, xq_, false, n, gate_.data());
      }
      to_part(LayerPart::ffn_in, LayerPart::ffn_up);
      OpTimer timer(prof(), Op::gemv_ffn_in);
      linear(w.up, h, xq_, quantized(w.gate), n, up_.data());  // gate's quantization of h, when it made one
    }
    {
      OpTimer timer(prof(), Op::ffn_act);
      gated_act(gate_.data(), up_.data(), gate_.data(), n * s.d_ff, s.act);
    }
    to_output_part();
    OpTimer timer(prof(), Op::gemv_ffn_down);
    linear(w.down, gate_.data(), xq_, false, n, h);
  }
  if (!output_ready) to_output_part();
  complete(PartialSums::Point::ffn, layer, h, n * d);
  if (s.sandwich_norm) rms_norm(h, w.post_ffn_norm, h, n, d, s.norm_eps);
  source_->done(layer, LayerPart::ffn_out);
  add_into(x, h, n * d);
}

void Engine::forward(const int32_t* tokens, const int32_t* positions, int64_t n, const uint8_t* tree_mask,
                     const int32_t* logit_rows, int64_t n_logit_rows, float* logits, int32_t* argmax,
                     bool extend_tree) {
  if (n_logit_rows > 0 && !logits && !argmax) throw engine_error("logit rows requested without an output");
  if (extend_tree && !tree_mask) throw engine_error("a tree is extended with a tree mask");
  const int64_t base = extend_tree ? scratch_count_ : 0;  // tree tokens of earlier calls, kept
  if (tree_mask && options_.kv_format == Format::kivi2)  // its 2-bit blocks cannot take a tree's scratch slots
    throw engine_error("a kivi2 KV cache does not verify token trees (use f16 or q8_0 with speculative decoding)");
  const ModelShape& s = shape_;
  if (n < 1 || n > options_.max_batch)
    throw engine_error("a forward call takes 1.." + std::to_string(options_.max_batch) + " tokens, got " +
                       std::to_string(n));
  if (!source_ || (!embed_.data && !embed_source_) || (!head_.data && !head_source_) || !out_norm_)
    throw engine_error("weights are not set");
  for (int64_t j = 0; j < n; ++j) {
    if (tokens[j] < 0 || tokens[j] >= s.vocab)
      throw engine_error("token id " + std::to_string(tokens[j]) + " is outside 0.." + std::to_string(s.vocab - 1));
    const int64_t expect_min = committed_, expect_max = committed_ + base + n - 1;
    if (positions[j] < expect_min || positions[j] > expect_max || (!tree_mask && positions[j] != committed_ + j))
      throw engine_error("position " + std::to_string(positions[j]) + " of new token " + std::to_string(j) +
                         " does not follow the " + std::to_string(committed_) + " cached tokens");
    if (positions[j] >= options_.context)
      throw engine_error("context full: position " + std::to_string(positions[j]) + " >= context " +
                         std::to_string(options_.context));
  }
  for (int64_t r = 0; r < n_logit_rows; ++r)
    if (logit_rows[r] < 0 || logit_rows[r] >= n) throw engine_error("logit row out of range");
  // a sliding-window layer's ring has max_batch slots of slack past its window for a tree
  if (base + n > options_.max_batch)
    throw engine_error("a tree of " + std::to_string(base + n) + " tokens is more than the batch of " +
                       std::to_string(options_.max_batch));
  if (committed_ + base + n > options_.context)  // its slots would wrap onto cached keys
    throw engine_error("context full: " + std::to_string(committed_) + " cached + " + std::to_string(base + n) +
                       " new tokens > context " + std::to_string(options_.context));

  if (!extend_tree) commit(nullptr, 0);  // drop an uncommitted tree from an earlier call
  hidden_rows_ = 0;
  OpTimer forward_timer(prof(), Op::forward);
  if (profiling_) {
    profile_.passes += 1;
    profile_.tokens += n;
  }

  // Embedding rows, scaled.
  embed(tokens, n, x_.data());
  if (s.embedding_scale != 1.0f)
    for (int64_t i = 0; i < n * s.d_model; ++i) x_[i] *= s.embedding_scale;

  source_->begin_pass(n_logit_rows > 0);
  for (int64_t layer = 0; layer < s.n_layers; ++layer) {
    const LayerCache& c = caches_[layer];
    for (int64_t j = 0; j < n; ++j) slots_[j] = static_cast<int32_t>((committed_ + base + j) % c.capacity);
    if (tree_mask) build_attention_mask(layer, n, base, tree_mask);
    const LayerWeights& w = [&]() -> const LayerWeights& {
      OpTimer timer(prof(), Op::weights_wait);
      return source_->acquire(layer);
    }();
    run_block(layer, w, n, positions, slots_.data(), tree_mask ? mask_.data() : nullptr);
    source_->release(layer);
  }

  if (tree_mask) {
    scratch_count_ = base + n;
    scratch_positions_.insert(scratch_positions_.end(), positions, positions + n);  // emptied by commit
  } else {
    committed_ += n;
  }

  if (n_logit_rows == 0) return;
  for (int64_t r = 0; r < n_logit_rows; ++r)
    std::memcpy(sel_.data() + r * s.d_model, x_.data() + static_cast<int64_t>(logit_rows[r]) * s.d_model,
                s.d_model * sizeof(float));
  rms_norm(sel_.data(), out_norm_, sel_.data(), n_logit_rows, s.d_model, s.norm_eps);
  hidden_rows_ = n_logit_rows;  // the head reads sel_ and leaves it as it is
  OpTimer head_timer(prof(), Op::gemv_head);
  if (!logits) {  // softcapping is monotonic: it does not change the argmax
    compute_argmax(n_logit_rows, argmax);
    return;
  }
  compute_logits(n_logit_rows, logits);
  if (s.final_softcap > 0.0f) {
    const float cap = s.final_softcap;
    for (int64_t i = 0; i < n_logit_rows * s.vocab; ++i) logits[i] = cap * std::tanh(logits[i] / cap);
  }
}

void Engine::complete(PartialSums::Point point, int64_t layer, float* x, int64_t count) {
  if (partial_sums_) partial_sums_->complete(point, layer, x, count);
}

void Engine::embed(const int32_t* tokens, int64_t n, float* x) {
  const ModelShape& s = shape_;
  if (s.vocab_begin == 0 && s.vocab_end == s.vocab) {
    if (embed_source_)
      embed_source_->rows(tokens, n, x);
    else
      dequantize_rows(embed_, tokens, n, x);
    return;
  }
  // This rank holds rows [vocab_begin, vocab_end): its tokens' rows, zeros for the others, summed over ranks.
  if (!partial_sums_) throw engine_error("a share of the vocabulary needs the partial sums of the other ranks");
  std::memset(x, 0, static_cast<size_t>(n * s.d_model) * sizeof(float));
  for (int64_t j = 0; j < n; ++j) {
    if (tokens[j] < s.vocab_begin || tokens[j] >= s.vocab_end) continue;
    const int32_t row = static_cast<int32_t>(tokens[j] - s.vocab_begin);
    if (embed_source_)
      embed_source_->rows(&row, 1, x + j * s.d_model);
    else
      dequantize_rows(embed_, &row, 1, x + j * s.d_model);
  }
  complete(PartialSums::Point::embedding, -1, x, n * s.d_model);
}

void Engine::set_head_shortlist(const WeightMatrix& rows, std::vector<int32_t> ids) {
  if (rows.rows != static_cast<int64_t>(ids.size()) || rows.cols != shape_.d_model)
    throw engine_error("a shortlist head needs one d_model row per token id");
  for (int32_t id : ids)
    if (id < 0 || id >= shape_.vocab) throw engine_error("shortlist token id out of range");
  head_ = rows;
  head_ids_ = std::move(ids);
  head_source_ = nullptr;
}

int64_t Engine::head_step() const {  // a panel-layout head is cut on panel boundaries
  return head_.layout == Layout::panels ? std::max(kPanelRows, options_.head_chunk / kPanelRows * kPanelRows)
                                        : options_.head_chunk;
}

WeightMatrix Engine::head_rows(int64_t r0, int64_t rows) const {
  const size_t rb = row_bytes(head_.fmt, head_.cols);
  const size_t bytes = head_.layout == Layout::panels ? panel_bytes(head_.fmt, rows, head_.cols) : rows * rb;
  return WeightMatrix{head_.data + r0 * rb, bytes, head_.fmt, rows, head_.cols, 0, head_.layout};
}

void Engine::compute_logits(int64_t m, float* logits) {
  auto rows_of = [&](int64_t r0, int64_t rows) { return head_rows(r0, rows); };
  bool ready = false;
  if (!head_ids_.empty()) {
    const int64_t k = static_cast<int64_t>(head_ids_.size());
    std::fill(logits, logits + m * shape_.vocab, -std::numeric_limits<float>::infinity());
    for (int64_t r0 = 0; r0 < k; r0 += options_.head_chunk) {
      const int64_t rows = std::min(options_.head_chunk, k - r0);
      linear(rows_of(r0, rows), sel_.data(), xq_, ready, m, head_part_.data());
      ready = true;
      for (int64_t t = 0; t < m; ++t)
        for (int64_t i = 0; i < rows; ++i) logits[t * shape_.vocab + head_ids_[r0 + i]] = head_part_[t * rows + i];
    }
    return;
  }
  // A rank holding part of the vocabulary writes its rows' logits; the others are -inf.
  const int64_t v0 = shape_.vocab_begin;
  if (v0 != 0 || shape_.vocab_end != shape_.vocab)
    std::fill(logits, logits + m * shape_.vocab, -std::numeric_limits<float>::infinity());
  if (!head_source_) {  // resident head, in row chunks so temporaries stay small
    if (m == 1 && (options_.act_mode != ActMode::q8x2 || 2 * head_.rows <= out2_capacity_)) {
      linear(head_, sel_.data(), xq_, false, 1, logits + v0);  // one row of logits: one pass, no temporaries
      return;
    }
    for (int64_t r0 = 0; r0 < head_.rows; r0 += head_step()) {
      const int64_t rows = std::min(head_step(), head_.rows - r0);
      float* out = m == 1 ? logits + v0 + r0 : head_part_.data();
      linear(rows_of(r0, rows), sel_.data(), xq_, ready, m, out);
      ready = true;
      if (m > 1)
        for (int64_t t = 0; t < m; ++t)
          std::memcpy(logits + t * shape_.vocab + v0 + r0, head_part_.data() + t * rows, rows * sizeof(float));
    }
    return;
  }
  // Streamed chunk by chunk; the activations are quantized once for every chunk.
  for (int64_t c = 0; c < head_source_->n_chunks(); ++c) {
    int64_t row0 = 0;
    const WeightMatrix& w = head_source_->acquire_chunk(c, &row0);
    if (row0 < 0 || v0 + row0 + w.rows > shape_.vocab_end) throw engine_error("head chunk rows outside the vocabulary");
    row0 += v0;
    if (m == 1) {
      linear(w, sel_.data(), xq_, ready, 1, logits + row0);
    } else {
      head_part_.resize(static_cast<size_t>(m * w.rows));
      linear(w, sel_.data(), xq_, ready, m, head_part_.data());
      for (int64_t t = 0; t < m; ++t)
        std::memcpy(logits + t * shape_.vocab + row0, head_part_.data() + t * w.rows, w.rows * sizeof(float));
    }
    ready = true;
    head_source_->release_chunk(c);
  }
}

void Engine::compute_argmax(int64_t m, int32_t* out) {
  // Head rows chunk by chunk, keeping each row's running best: memory is [m, chunk], not [m, vocab].
  std::vector<float> best(static_cast<size_t>(m), -std::numeric_limits<float>::infinity());
  std::fill(out, out + m, 0);
  bool ready = false;
  auto fold = [&](const WeightMatrix& w, int64_t row0, const int32_t* ids) {
    head_part_.resize(static_cast<size_t>(m * w.rows));
    linear(w, sel_.data(), xq_, ready, m, head_part_.data());
    ready = true;
    for (int64_t t = 0; t < m; ++t)
      for (int64_t r = 0; r < w.rows; ++r) {
        const float v = head_part_[t * w.rows + r];
        const int32_t id = ids ? ids[r] : static_cast<int32_t>(row0 + r);
        if (v > best[t] || (v == best[t] && id < out[t])) best[t] = v, out[t] = id;
      }
  };
  if (!head_ids_.empty()) {
    const size_t rb = row_bytes(head_.fmt, head_.cols);
    const int64_t k = static_cast<int64_t>(head_ids_.size());
    for (int64_t r0 = 0; r0 < k; r0 += options_.head_chunk) {
      const int64_t rows = std::min(options_.head_chunk, k - r0);
      fold(WeightMatrix{head_.data + r0 * rb, static_cast<size_t>(rows) * rb, head_.fmt, rows, head_.cols, 0}, 0,
           head_ids_.data() + r0);
    }
  } else if (head_source_) {
    for (int64_t c = 0; c < head_source_->n_chunks(); ++c) {
      int64_t row0 = 0;
      const WeightMatrix& w = head_source_->acquire_chunk(c, &row0);
      fold(w, shape_.vocab_begin + row0, nullptr);
      head_source_->release_chunk(c);
    }
  } else {
    for (int64_t r0 = 0; r0 < head_.rows; r0 += head_step())
      fold(head_rows(r0, std::min(head_step(), head_.rows - r0)), shape_.vocab_begin + r0, nullptr);
  }
}

void Engine::hidden(float* out, int64_t rows) const {
  if (rows != hidden_rows_)
    throw engine_error("hidden: the last forward normed " + std::to_string(hidden_rows_) + " rows, not " +
                       std::to_string(rows));
  std::memcpy(out, sel_.data(), static_cast<size_t>(rows * shape_.d_model) * sizeof(float));
}

void Engine::commit(const int32_t* nodes, int64_t n_nodes) {
  if (n_nodes > scratch_count_) throw engine_error("commit: more nodes than the last tree had");
  for (int64_t d = 0; d < n_nodes; ++d) {
    if (nodes[d] < d || nodes[d] >= scratch_count_ || (d > 0 && nodes[d] <= nodes[d - 1]))
      throw engine_error("commit: nodes must be increasing tree indices of the last forward");
    if (scratch_positions_[nodes[d]] != committed_ + d)
      throw engine_error("commit: node " + std::to_string(nodes[d]) + " is not at depth " + std::to_string(d));
  }
  if (n_nodes == 0 && scratch_count_ == 0) return;
  const size_t row = kv_row_bytes(options_.kv_format, shape_.head_dim);  // trees never reach a kivi2 cache
  for (LayerCache& c : caches_) {
    // Copy in increasing depth: a later source slot is never an earlier destination.
    for (int64_t d = 0; d < n_nodes; ++d) {
      const int64_t src = (committed_ + nodes[d]) % c.capacity, dst = (committed_ + d) % c.capacity;
      if (src != dst) {
        for (int64_t head = 0; head < shape_.n_kv_heads; ++head) {
          const size_t base = static_cast<size_t>(head * c.capacity) * row;
          std::memcpy(c.k.data() + base + dst * row, c.k.data() + base + src * row, row);
          std::memcpy(c.v.data() + base + dst * row, c.v.data() + base + src * row, row);
        }
      }
      c.slot_pos[dst] = static_cast<int32_t>(committed_ + d);
    }
    for (int64_t j = n_nodes; j < scratch_count_; ++j) c.slot_pos[(committed_ + j) % c.capacity] = -1;
  }
  committed_ += n_nodes;
  scratch_count_ = 0;
  scratch_positions_.clear();
}

int64_t Engine::truncate(int64_t n) {
  commit(nullptr, 0);
  if (n >= committed_) return committed_;
  if (n < 0) n = 0;
  if (options_.kv_format == Format::kivi2)  // a 2-bit block is kept whole or not at all
    for (const LayerCache& c : caches_)
      if (n < c.sealed) n = n / kKiviGroup * kKiviGroup;
  bool intact = true;
  for (size_t l = 0; l < caches_.size(); ++l) {
    LayerCache& c = caches_[l];
    for (int32_t& p : c.slot_pos)
      if (p >= n) p = -1;
    const int64_t window = layer_shapes_[l].window;
    for (int64_t p = std::max<int64_t>(0, n - window); window && p < n; ++p)
      if (c.slot_pos[p % c.capacity] != p) intact = false;
  }
  if (!intact) {
    for (LayerCache& c : caches_) std::fill(c.slot_pos.begin(), c.slot_pos.end(), -1);
    n = 0;
  }
  for (LayerCache& c : caches_) c.sealed = std::min(c.sealed, n);
  committed_ = n;
  return committed_;
}

}  // namespace ef::engine
