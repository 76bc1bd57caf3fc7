// AVX-512 level: the quantized GEMM with VNNI dpbusd (u8 x s8 -> s32 in one instruction).
// Everything else comes from the AVX2 level below it in the dispatch table.
#include "x86_quant.h"

namespace ef::x86 {
namespace {

struct VnniCore {
  static constexpr bool kUnsignedOnly = true;  // signed codes are offset by 128 by the emitter
  template <bool Signed>
  static inline __m256i dot(__m256i c, __m256i x) {
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), c, x);
  }
};

}  // namespace
}  // namespace ef::x86

namespace ef {
void install_avx512(KernelTable& t) {
  using namespace x86;
  const char* n = "avx512";
  t.gemm_q8[int(Format::q8_0)].set(gemm_q8<VnniCore, Q8_0>, n);
  t.gemm_q8[int(Format::q4_0)].set(gemm_q8<VnniCore, Q4_0>, n);
  t.gemm_q8[int(Format::q4_1)].set(gemm_q8<VnniCore, Q4_1>, n);
  t.gemm_q8[int(Format::q5_0)].set(gemm_q8<VnniCore, Q5_0>, n);
  t.gemm_q8[int(Format::q4_k)].set(gemm_q8<VnniCore, Q4_K>, n);
  t.gemm_q8[int(Format::q6_k)].set(gemm_q8<VnniCore, Q6_K>, n);
  t.gemm_q8[int(Format::q4_lut)].set(gemm_q8<VnniCore, Q4_LUT>, n);
}
}  // namespace ef
