// AVX2 level: quantized GEMM with maddubs (u8 x s8 -> s16 pairs) on the panel layout, and on the
// row layout through the same arithmetic (avx2_panel.h; q4_lut rows: x86_quant.h), float GEMM,
// dequantization.
#include "avx2_lut_panel.h"
#include "avx2_panel.h"
#include "x86_float.h"
#include "x86_quant.h"

namespace ef::x86 {
namespace {

struct Avx2Core {
  static constexpr bool kUnsignedOnly = false;
  template <bool Signed>
  static inline __m256i dot(__m256i c, __m256i x) {
    const __m256i ones = _mm256_set1_epi16(1);
    if constexpr (Signed) {
      // |c| * (x with c's sign): products stay within int16 pairs (codes are in [-128, 127]).
      return _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_sign_epi8(c, c), _mm256_sign_epi8(x, c)), ones);
    } else {
      return _mm256_madd_epi16(_mm256_maddubs_epi16(c, x), ones);
    }
  }
};

}  // namespace
}  // namespace ef::x86

namespace ef {
void install_avx2(KernelTable& t) {
  using namespace x86;
  const char* n = "avx2";
  t.gemm_q8[int(Format::q8_0)].set(gemm_rows<AQ8_0>, n);
  t.gemm_q8[int(Format::q4_0)].set(gemm_rows<AQ4_0>, n);
  t.gemm_q8[int(Format::q4_1)].set(gemm_rows<AQ4_1>, n);
  t.gemm_q8[int(Format::q5_0)].set(gemm_rows<AQ5_0>, n);
  t.gemm_q8[int(Format::q4_k)].set(gemm_rows<AQ4_K>, n);
  t.gemm_q8[int(Format::q6_k)].set(gemm_rows<AQ6_K>, n);
  t.gemm_q8[int(Format::q3_k)].set(gemm_rows<AQ3_K>, n);
  t.gemm_q8[int(Format::q4_lut)].set(gemm_q8<Avx2Core, Q4_LUT>, n);
  t.gemm_q8_panels[int(Format::q8_0)].set(gemm_panels<AQ8_0>, n);
  t.gemm_q8_panels[int(Format::q4_0)].set(gemm_panels<AQ4_0>, n);
  t.gemm_q8_panels[int(Format::q4_1)].set(gemm_panels<AQ4_1>, n);
  t.gemm_q8_panels[int(Format::q5_0)].set(gemm_panels<AQ5_0>, n);
  t.gemm_q8_panels[int(Format::q4_k)].set(gemm_panels<AQ4_K>, n);
  t.gemm_q8_panels[int(Format::q6_k)].set(gemm_panels<AQ6_K>, n);
  t.gemm_q8_panels[int(Format::q3_k)].set(gemm_panels<AQ3_K>, n);
  t.gemm_q8_panels[int(Format::q4_lut)].set(gemm_panels_lut, n);
  t.gemm_f32[int(Format::f32)].set(gemm_f<false>, n);
  t.gemm_f32[int(Format::f16)].set(gemm_f<true>, n);
  t.dequant[int(Format::f32)].set(dequant_f<false>, n);
  t.dequant[int(Format::f16)].set(dequant_f<true>, n);
  t.dequant[int(Format::q8_0)].set(dequant<Q8_0>, n);
  t.dequant[int(Format::q4_0)].set(dequant<Q4_0>, n);
  t.dequant[int(Format::q4_1)].set(dequant<Q4_1>, n);
  t.dequant[int(Format::q5_0)].set(dequant<Q5_0>, n);
  t.dequant[int(Format::q4_k)].set(dequant<Q4_K>, n);
  t.dequant[int(Format::q6_k)].set(dequant<Q6_K>, n);
  t.dequant[int(Format::q3_k)].set(dequant<Q3_K>, n);
  t.dequant[int(Format::q4_lut)].set(dequant<Q4_LUT>, n);
  t.ffn_down[int(Format::f32)].set(ffn_down_f<false>, n);
  t.ffn_down[int(Format::f16)].set(ffn_down_f<true>, n);
  t.ffn_down[int(Format::q8_0)].set(ffn_down<Q8_0>, n);
  t.ffn_down[int(Format::q4_0)].set(ffn_down<Q4_0>, n);
  t.ffn_down[int(Format::q4_1)].set(ffn_down<Q4_1>, n);
  t.ffn_down[int(Format::q5_0)].set(ffn_down<Q5_0>, n);
  t.ffn_down[int(Format::q4_k)].set(ffn_down<Q4_K>, n);
  t.ffn_down[int(Format::q6_k)].set(ffn_down<Q6_K>, n);
  t.ffn_down[int(Format::q3_k)].set(ffn_down<Q3_K>, n);
  t.ffn_down[int(Format::q4_lut)].set(ffn_down<Q4_LUT>, n);
  t.quantize_acts.set(quantize_acts, n);
  void install_avx2_ops(KernelTable & t);
  install_avx2_ops(t);
}
}  // namespace ef
