#include "layer_source.h"

namespace ef {
namespace {
// Indexed by Slot: the one table of slot names and parts (Python reads it through the bindings).
const SlotInfo kSlots[kSlotCount] = {
    {"q", "attn_q.weight", LayerPart::attention},
    {"k", "attn_k.weight", LayerPart::attention},
    {"v", "attn_v.weight", LayerPart::attention},
    {"o", "attn_output.weight", LayerPart::attention},
    {"gate", "ffn_gate.weight", LayerPart::ffn_in},
    {"up", "ffn_up.weight", LayerPart::ffn_up},
    {"down", "ffn_down.weight", LayerPart::ffn_out},
    {"pred_a", "predictor_a.weight", LayerPart::ffn_in},
    {"pred_b", "predictor_b.weight", LayerPart::ffn_in},
    {"ffn_arena", "ffn_arena", LayerPart::ffn_in},
    {"attn_norm", "attn_norm.weight", LayerPart::attention},
    {"ffn_norm", "ffn_norm.weight", LayerPart::ffn_in},
    {"post_attn_norm", "post_attention_norm.weight", LayerPart::attention},
    {"post_ffn_norm", "post_ffw_norm.weight", LayerPart::ffn_out},
    {"q_norm", "attn_q_norm.weight", LayerPart::attention},
    {"k_norm", "attn_k_norm.weight", LayerPart::attention},
    {"q_bias", "attn_q.bias", LayerPart::attention},
    {"k_bias", "attn_k.bias", LayerPart::attention},
    {"v_bias", "attn_v.bias", LayerPart::attention},
};
}  // namespace

const SlotInfo& slot_info(Slot s) {
  const int i = static_cast<int>(s);
  if (i < 0 || i >= kSlotCount) throw KernelError("unknown layer slot id " + std::to_string(i));
  return kSlots[i];
}

bool parse_slot(const std::string& name, Slot* out) {
  for (int i = 0; i < kSlotCount; ++i) {
    if (name == kSlots[i].name) {
      *out = static_cast<Slot>(i);
      return true;
    }
  }
  return false;
}

WeightMatrix& LayerWeights::matrix(Slot s) {
  switch (s) {
    case Slot::q: return q;
    case Slot::k: return k;
    case Slot::v: return v;
    case Slot::o: return o;
    case Slot::gate: return gate;
    case Slot::up: return up;
    case Slot::down: return down;
    case Slot::pred_a: return pred_a;
    case Slot::pred_b: return pred_b;
    case Slot::ffn_arena: return ffn_arena;
    default: throw KernelError(std::string("'") + slot_info(s).name + "' is a vector, not a matrix");
  }
}

const float*& LayerWeights::vector(Slot s) {
  switch (s) {
    case Slot::attn_norm: return attn_norm;
    case Slot::ffn_norm: return ffn_norm;
    case Slot::post_attn_norm: return post_attn_norm;
    case Slot::post_ffn_norm: return post_ffn_norm;
    case Slot::q_norm: return q_norm;
    case Slot::k_norm: return k_norm;
    case Slot::q_bias: return q_bias;
    case Slot::k_bias: return k_bias;
    case Slot::v_bias: return v_bias;
    default: throw KernelError(std::string("'") + slot_info(s).name + "' is a matrix, not a vector");
  }
}

}  // namespace ef
