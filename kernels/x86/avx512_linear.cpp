// AVX-512 level: the quantized GEMM with VNNI dpbusd on 512-bit registers (two units at a time).
// Everything else comes from the AVX2 level below it in the dispatch table.
#include "avx512_quant.h"

namespace ef::x86 {
namespace {


}  // namespace
}  // namespace ef::x86

namespace ef {
void install_avx512(KernelTable& t) {
  using namespace x86;
  const char* n = "avx512";
  t.gemm_q8[int(Format::q8_0)].set(gemm_q8_512<P_Q8_0>, n);
  t.gemm_q8[int(Format::q4_0)].set(gemm_q8_512<P_Q4_0>, n);
  t.gemm_q8[int(Format::q4_1)].set(gemm_q8_512<P_Q4_1>, n);
  t.gemm_q8[int(Format::q5_0)].set(gemm_q8_512<P_Q5_0>, n);
  t.gemm_q8[int(Format::q4_k)].set(gemm_q8_512<P_Q4_K>, n);
  t.gemm_q8[int(Format::q6_k)].set(gemm_q8_512<P_Q6_K>, n);
  t.gemm_q8[int(Format::q4_lut)].set(gemm_q8_512<P_Q4_LUT>, n);
}
}  // namespace ef
