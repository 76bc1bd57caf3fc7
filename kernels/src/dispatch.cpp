// CPU feature detection and THE table of instruction-set levels. A level is usable when the CPU
// (and OS) supports it; the active kernel table is built by installing every usable level up to
// the chosen one, in order, so each kernel runs the best implementation that level provides.
#include <atomic>
#include <mutex>

#include "kernel_table.h"

#if defined(__x86_64__) || defined(_M_X64)
#include <cpuid.h>
#define EF_ARCH_X86 1
#elif defined(__aarch64__) && defined(__APPLE__)
#include <sys/sysctl.h>
#define EF_ARCH_ARM64 1
#define EF_ARM64_APPLE 1
#elif defined(__aarch64__)
#include <sys/auxv.h>
#define EF_ARCH_ARM64 1
#endif

namespace ef {
namespace {

bool has_flag(const CpuFeatures& f, const char* name) {
  for (const auto& s : f.flags)
    if (s == name) return true;
  return false;
}

CpuFeatures detect() {
  CpuFeatures f;
#if defined(EF_ARCH_X86)
  f.arch = "x86_64";
  unsigned a = 0, b = 0, c = 0, d = 0;
  __cpuid(0, a, b, c, d);
  const unsigned max_leaf = a;
  __cpuid(1, a, b, c, d);
  const bool osxsave = c & (1u << 27);
  uint64_t xcr0 = 0;
  if (osxsave) {
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    xcr0 = (static_cast<uint64_t>(hi) << 32) | lo;
  }
  const bool os_avx = (xcr0 & 0x6) == 0x6;       // XMM and YMM state saved by the OS
  const bool os_avx512 = (xcr0 & 0xe6) == 0xe6;  // plus opmask and ZMM state
  if (c & (1u << 12) && os_avx) f.flags.push_back("fma");
  if (c & (1u << 29) && os_avx) f.flags.push_back("f16c");
  if (c & (1u << 28) && os_avx) f.flags.push_back("avx");
  if (max_leaf >= 7) {
    __cpuid_count(7, 0, a, b, c, d);
    if (b & (1u << 5) && os_avx) f.flags.push_back("avx2");
    if (os_avx512) {
      if (b & (1u << 16)) f.flags.push_back("avx512f");
      if (b & (1u << 17)) f.flags.push_back("avx512dq");
      if (b & (1u << 30)) f.flags.push_back("avx512bw");
      if (b & (1u << 31)) f.flags.push_back("avx512vl");
      if (c & (1u << 11)) f.flags.push_back("avx512vnni");
    }
    __cpuid_count(7, 1, a, b, c, d);
    if (a & (1u << 4) && os_avx) f.flags.push_back("avxvnni");
  }
#elif defined(EF_ARM64_APPLE)
  f.arch = "aarch64";
  auto has = [](const char* key) {
    int v = 0;
    size_t n = sizeof(v);
    return sysctlbyname(key, &v, &n, nullptr, 0) == 0 && v != 0;
  };
  f.flags.push_back("asimd");  // every Apple arm64 core has Advanced SIMD
  if (has("hw.optional.arm.FEAT_FP16")) f.flags.push_back("asimdhp");
  if (has("hw.optional.arm.FEAT_DotProd")) f.flags.push_back("asimddp");
  if (has("hw.optional.arm.FEAT_I8MM")) f.flags.push_back("i8mm");
#elif defined(EF_ARCH_ARM64)
  f.arch = "aarch64";
  const unsigned long hw = getauxval(AT_HWCAP), hw2 = getauxval(AT_HWCAP2);
  if (hw & (1ul << 1)) f.flags.push_back("asimd");
  if (hw & (1ul << 10)) f.flags.push_back("asimdhp");
  if (hw & (1ul << 20)) f.flags.push_back("asimddp");
  if (hw2 & (1ul << 13)) f.flags.push_back("i8mm");
#else
  f.arch = "other";
#endif
  return f;
}

struct IsaLevel {
  const char* name;
  const char* required[6];  // cpu feature flags, null-terminated
  void (*install)(KernelTable&);
};

// The one table. Order matters: each level builds on the ones before it.
const IsaLevel kLevels[] = {
    {"ref", {nullptr}, install_ref},
#if defined(EF_ARCH_X86)
    {"avx2", {"avx2", "fma", "f16c", nullptr}, install_avx2},
    {"avx512", {"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512vnni", nullptr}, install_avx512},
#elif defined(EF_ARCH_ARM64)
    {"neon", {"asimd", nullptr}, install_neon},
    {"neon_dotprod", {"asimd", "asimddp", nullptr}, install_neon_dotprod},
    {"neon_i8mm", {"asimd", "asimddp", "i8mm", nullptr}, install_neon_i8mm},
#endif
};
constexpr int kNumLevels = sizeof(kLevels) / sizeof(kLevels[0]);

bool supported(const IsaLevel& level) {
  for (int i = 0; level.required[i]; ++i)
    if (!has_flag(cpu_features(), level.required[i])) return false;
  return true;
}

struct State {
  KernelTable tables[kNumLevels];
  std::atomic<const KernelTable*> active{nullptr};
  int active_level = 0;
  std::mutex mutex;
  State() {
    for (int lvl = 0; lvl < kNumLevels; ++lvl)
      for (int i = 0; i <= lvl; ++i)
        if (supported(kLevels[i])) kLevels[i].install(tables[lvl]);
    select(best());
  }
  int best() const {
    int b = 0;
    for (int i = 0; i < kNumLevels; ++i)
      if (supported(kLevels[i])) b = i;
    return b;
  }
  void select(int lvl) {
    active_level = lvl;
    active.store(&tables[lvl], std::memory_order_release);
  }
};

State& state() {
  static State* s = new State();
  return *s;
}

}  // namespace

const CpuFeatures& cpu_features() {
  static const CpuFeatures f = detect();
  return f;
}

const KernelTable& kernels() { return *state().active.load(std::memory_order_acquire); }

std::vector<std::string> available_isas() {
  std::vector<std::string> out;
  for (const auto& l : kLevels)
    if (supported(l)) out.emplace_back(l.name);
  return out;
}

void use_isa(const std::string& name) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  if (name == "auto") {
    s.select(s.best());
    return;
  }
  std::string known;
  for (int i = 0; i < kNumLevels; ++i) {
    if (name == kLevels[i].name) {
      if (!supported(kLevels[i]))
        throw KernelError("instruction set '" + name + "' is not supported by this CPU");
      s.select(i);
      return;
    }
    known += std::string(known.empty() ? "" : ", ") + kLevels[i].name;
  }
  throw KernelError("unknown instruction set '" + name + "', expected auto or one of: " + known);
}

std::string current_isa() {
  State& s = state();
  kernels();
  return kLevels[s.active_level].name;
}

bool runs_format(Format f) {
  const KernelTable& t = kernels();
  const int i = static_cast<int>(f);
  return i >= 0 && i < kFormatCount && t.dequant[i].fn && (t.gemm_q8[i].fn || t.gemm_f32[i].fn);
}

std::vector<std::pair<std::string, std::string>> implementations() {
  const KernelTable& t = kernels();
  std::vector<std::pair<std::string, std::string>> out;
  for (int f = 0; f < kFormatCount; ++f) {
    const std::string fmt = format_info(static_cast<Format>(f)).name;
    if (t.gemm_q8[f].fn) out.emplace_back("gemm_q8_" + fmt, t.gemm_q8[f].isa);
    if (t.gemm_q8_panels[f].fn) out.emplace_back("gemm_q8_panels_" + fmt, t.gemm_q8_panels[f].isa);
    if (t.gemm_f32[f].fn) out.emplace_back("gemm_f32_" + fmt, t.gemm_f32[f].isa);
    if (t.dequant[f].fn) out.emplace_back("dequant_" + fmt, t.dequant[f].isa);
    if (t.ffn_down[f].fn) out.emplace_back("ffn_down_" + fmt, t.ffn_down[f].isa);
    if (t.columns_q8[f].fn) out.emplace_back("columns_q8_" + fmt, t.columns_q8[f].isa);
    if (t.columns_q8_packed[f].fn) out.emplace_back("columns_q8_packed_" + fmt, t.columns_q8_packed[f].isa);
  }
  out.emplace_back("quantize_acts", t.quantize_acts.isa);
  out.emplace_back("attention_f16", t.attn_chunk[0].isa);
  out.emplace_back("attention_q8_0", t.attn_chunk[1].isa);
  out.emplace_back("rms_norm", t.rms_norm.isa);
  out.emplace_back("rope", t.rope_apply.isa);
  out.emplace_back("gated_silu", t.gated_act[0].isa);
  out.emplace_back("gated_gelu_tanh", t.gated_act[1].isa);
  out.emplace_back("softmax", t.softmax.isa);
  out.emplace_back("argmax", t.argmax.isa);
  out.emplace_back("to_half", t.to_half.isa);
  out.emplace_back("topk", t.topk.isa);
  return out;
}

}  // namespace ef
