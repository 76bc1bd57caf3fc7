// Wall time of a forward pass split by operation, for the per-token roofline report
// (`edgeflash bench roofline`). Off unless asked for: every timed region then costs one
// predictable branch on a null pointer, so normal runs carry no timing code in the hot path.
#pragma once

#include <chrono>
#include <cstdint>

namespace ef::engine {

// What a forward pass spends its time on. GEMV regions include the activation quantization and
// the thread hand-offs of their matmul calls; `forward` is the whole pass, so whatever is not in
// a named region (embedding, norms, RoPE, biases, residual adds) is forward minus the rest.
enum class Op : int {
  forward,
  gemv_qkv,       // q, k, v projections
  attention,      // KV write and attention over the cache
  gemv_o,         // attention output projection
  gemv_ffn_in,    // gate and up projections
  ffn_act,        // act(gate) * up
  gemv_ffn_down,  // down projection
  ffn_hook,       // a replacement FFN (sparse mode)
  ffn_arena,      // the dense FFN read from a bundle's neuron arena (gate, up, act and down in one kernel)
  gemv_head,      // logits or their argmax
  weights_wait,   // a layer source's acquire (streaming: waiting for flash)
  count
};
constexpr int kOpCount = static_cast<int>(Op::count);

inline const char* op_name(Op op) {
  static const char* const kNames[kOpCount] = {"forward", "gemv_qkv", "attention", "gemv_o", "gemv_ffn_in",
                                               "ffn_act", "gemv_ffn_down", "ffn_hook", "ffn_arena",
                                               "gemv_head",
                                               "weights_wait"};
  return kNames[static_cast<int>(op)];
}

struct OpProfile {
  double seconds[kOpCount] = {};
  int64_t calls[kOpCount] = {};
  int64_t passes = 0, tokens = 0;  // forward calls and the tokens they ran
};

// Adds the time from construction to destruction to `profile` (nothing when it is null).
class OpTimer {
 public:
  OpTimer(OpProfile* profile, Op op) : profile_(profile), op_(op) {
    if (profile_) start_ = std::chrono::steady_clock::now();
  }
  ~OpTimer() {
    if (!profile_) return;
    const int i = static_cast<int>(op_);
    profile_->seconds[i] += std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    profile_->calls[i] += 1;
  }
  OpTimer(const OpTimer&) = delete;
  OpTimer& operator=(const OpTimer&) = delete;

 private:
  OpProfile* profile_;
  Op op_;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace ef::engine
