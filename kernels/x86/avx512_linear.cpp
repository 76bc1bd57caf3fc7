// AVX-512 level: the quantized GEMM on 16-row panels with VNNI dpbusd (avx512_panel.h), from the
// row layout (transposed on the fly) and from the panel layout (kernels.h); q4_lut's panels have a
// kernel of their own (avx512_lut_panel.h).
// Everything else comes from the AVX2 level below it in the dispatch table.
#include "avx512_lut_panel.h"
#include "avx512_panel.h"

namespace ef {
void install_avx512(KernelTable& t) {
  using namespace x86;
  const char* n = "avx512";
  t.gemm_q8[int(Format::q8_0)].set(gemm_q8_panels<PQ8_0>, n);
  t.gemm_q8[int(Format::q4_0)].set(gemm_q8_panels<PQ4_0>, n);
  t.gemm_q8[int(Format::q4_1)].set(gemm_q8_panels<PQ4_1>, n);
  t.gemm_q8[int(Format::q5_0)].set(gemm_q8_panels<PQ5_0>, n);
  t.gemm_q8[int(Format::q4_k)].set(gemm_q8_panels<PQ4_K>, n);
  t.gemm_q8[int(Format::q6_k)].set(gemm_q8_panels<PQ6_K>, n);
  t.gemm_q8[int(Format::q3_k)].set(gemm_q8_panels<PQ3_K>, n);
  t.gemm_q8[int(Format::q4_lut)].set(gemm_q8_panels<PQ4_LUT>, n);
  t.gemm_q8_panels[int(Format::q8_0)].set(gemm_q8_packed<PQ8_0>, n);
  t.gemm_q8_panels[int(Format::q4_0)].set(gemm_q8_packed<PQ4_0>, n);
  t.gemm_q8_panels[int(Format::q4_1)].set(gemm_q8_packed<PQ4_1>, n);
  t.gemm_q8_panels[int(Format::q5_0)].set(gemm_q8_packed<PQ5_0>, n);
  t.gemm_q8_panels[int(Format::q4_k)].set(gemm_q8_packed<PQ4_K>, n);
  t.gemm_q8_panels[int(Format::q6_k)].set(gemm_q8_packed<PQ6_K>, n);
  t.gemm_q8_panels[int(Format::q3_k)].set(gemm_q8_packed<PQ3_K>, n);
  t.gemm_q8_panels[int(Format::q4_lut)].set(gemm_q8_packed_lut, n);
  void install_avx512_ops(KernelTable & t);
  install_avx512_ops(t);
  void install_avx512_down(KernelTable & t);
  install_avx512_down(t);
}
}  // namespace ef
