// NEON + dotprod level (ARMv8.2+, e.g. Cortex-A55/A76 and later): quantized GEMM with sdot.
#include "neon_lut_panel.h"
#include "neon_panel.h"
#include "neon_quant.h"

namespace ef::arm {
namespace {

struct DotCore {
  static inline int32x4_t dot(int8x16_t c, int8x16_t x) { return vdotq_s32(vdupq_n_s32(0), c, x); }
  static inline int32x4_t dot2(int8x16_t c0, int8x16_t x0, int8x16_t c1, int8x16_t x1) {
    return vdotq_s32(vdotq_s32(vdupq_n_s32(0), c0, x0), c1, x1);
  }
  // acc[i] += dot(bytes 4i..4i+3 of w, bytes 4L..4L+3 of x): one sdot by element.
  template <int L>
  static inline int32x4_t lane(int32x4_t acc, int8x16_t w, int8x16_t x) {
    return vdotq_laneq_s32(acc, w, x, L);
  }
};

}  // namespace
}  // namespace ef::arm

namespace ef {
void install_neon_dotprod(KernelTable& t) {
  using namespace arm;
  const char* n = "neon_dotprod";
  t.gemm_q8[int(Format::q8_0)].set(gemm_q8<DotCore, Q8_0>, n);
  t.gemm_q8[int(Format::q4_0)].set(gemm_q8<DotCore, Q4_0>, n);
  t.gemm_q8[int(Format::q4_1)].set(gemm_q8<DotCore, Q4_1>, n);
  t.gemm_q8[int(Format::q5_0)].set(gemm_q8<DotCore, Q5_0>, n);
  t.gemm_q8[int(Format::q4_k)].set(gemm_q8<DotCore, Q4_K>, n);
  t.gemm_q8[int(Format::q6_k)].set(gemm_q8<DotCore, Q6_K>, n);
  t.gemm_q8[int(Format::q3_k)].set(gemm_q8<DotCore, Q3_K>, n);
  t.gemm_q8[int(Format::q4_lut)].set(gemm_q8<DotCore, Q4_LUT>, n);
  t.gemm_q8_panels[int(Format::q8_0)].set(gemm_panels<DotCore, NQ8_0>, n);
  t.gemm_q8_panels[int(Format::q4_0)].set(gemm_panels<DotCore, NQ4_0>, n);
  t.gemm_q8_panels[int(Format::q4_1)].set(gemm_panels<DotCore, NQ4_1>, n);
  t.gemm_q8_panels[int(Format::q5_0)].set(gemm_panels<DotCore, NQ5_0>, n);
  t.gemm_q8_panels[int(Format::q4_k)].set(gemm_panels<DotCore, NQ4_K>, n);
  t.gemm_q8_panels[int(Format::q6_k)].set(gemm_panels<DotCore, NQ6_K>, n);
  t.gemm_q8_panels[int(Format::q3_k)].set(gemm_panels<DotCore, NQ3_K>, n);
  t.gemm_q8_panels[int(Format::q4_lut)].set(gemm_panels_lut<DotCore>, n);
}
}  // namespace ef
