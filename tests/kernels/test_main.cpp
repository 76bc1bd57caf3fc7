// Runs every kernel at every non-reference instruction-set level this CPU supports, at 1 and 2
// threads, against the scalar reference twins. Prints which implementation each kernel used.
// Usage: ef_kernel_tests [--expect-isa NAME]...   (fails if an expected level is not available)
#include <algorithm>
#include <map>
#include <set>

#include "test_util.h"

namespace eftest {

Stats& stats() {
  static Stats s;
  return s;
}

bool expect(bool ok, const std::string& what) {
  ++stats().checks;
  if (!ok) {
    ++stats().failures;
    std::printf("FAIL [%s t=%d] %s\n", ef::current_isa().c_str(), ef::get_num_threads(), what.c_str());
  }
  return ok;
}

ErrReport rel_err(const std::vector<float>& got, const std::vector<float>& want, const std::vector<double>& scale,
                  double floor) {
  ErrReport r;
  if (got.size() != want.size()) {
    r.max_err = INFINITY;
    return r;
  }
  for (size_t i = 0; i < got.size(); ++i) {
    const double s = scale.size() == 1 ? scale[0] : scale[i];
    const double e = std::fabs(static_cast<double>(got[i]) - want[i]) / std::max(s, floor);
    if (!(e <= r.max_err)) r.max_err = e, r.worst = static_cast<int64_t>(i);
  }
  return r;
}

static std::string g_level = "ref";
const std::string& level() { return g_level; }

static std::map<std::string, std::set<std::string>> g_impls;  // level -> "kernel=impl"

void note_impl(const std::string& kernel) {
  for (const auto& [k, impl] : ef::implementations()) {
    if (k != kernel) continue;
    g_impls[g_level].insert(k + "=" + impl);
    expect(impl != "ref", "kernel " + k + " ran the reference implementation at level " + g_level);
    return;
  }
  expect(false, "kernel " + kernel + " is not in the dispatch table");
}

std::mt19937& rng() {
  static std::mt19937 r(1234);
  return r;
}

std::vector<float> randn(size_t n, float scale) {
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng());
  return v;
}

static void put_h(uint8_t* p, float v) {
  const uint16_t h = ef::f32_to_fp16(v);
  std::memcpy(p, &h, 2);
}

std::vector<uint8_t> random_weights(ef::Format f, int64_t rows, int64_t cols) {
  const size_t rb = ef::row_bytes(f, cols);
  std::vector<uint8_t> w(rb * rows);
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_real_distribution<float> sc(0.002f, 0.05f);
  for (auto& b : w) b = static_cast<uint8_t>(byte(rng()));
  const auto& info = ef::format_info(f);
  for (int64_t r = 0; r < rows; ++r) {
    uint8_t* row = w.data() + r * rb;
    if (f == ef::Format::f32) {
      for (int64_t c = 0; c < cols; ++c) {
        const float v = randn(1, 0.05f)[0];
        std::memcpy(row + 4 * c, &v, 4);
      }
      continue;
    }
    if (f == ef::Format::f16) {
      for (int64_t c = 0; c < cols; ++c) put_h(row + 2 * c, randn(1, 0.05f)[0]);
      continue;
    }
    if (f == ef::Format::q4_lut) {
      const float s = sc(rng()) * 0.05f / 32.0f;  // block scales s * k^2 with codes k in 1..8
      std::memcpy(row, &s, 4);
      row += 20;
      for (int64_t b = 0; b < cols / 32; ++b) row[b * 17] = static_cast<uint8_t>(1 + rng()() % 8);
    }
    for (int64_t b = 0; b < cols / info.block_elems; ++b) {
      uint8_t* blk = row + b * info.block_bytes;
      switch (f) {
        case ef::Format::q4_1: put_h(blk + 2, -8.0f * sc(rng())); [[fallthrough]];
        case ef::Format::q8_0:
        case ef::Format::q4_0:
        case ef::Format::q5_0: put_h(blk, sc(rng())); break;
        case ef::Format::q4_k: put_h(blk, sc(rng()) * 0.1f), put_h(blk + 2, sc(rng()) * 0.1f); break;
        case ef::Format::q6_k: put_h(blk + 208, sc(rng()) * 0.02f); break;
        case ef::Format::q3_k: put_h(blk + 108, sc(rng()) * 0.02f); break;
        default: break;
      }
    }
  }
  return w;
}

std::vector<float> ref_dequant(ef::Format f, const std::vector<uint8_t>& w, int64_t rows, int64_t cols) {
  return under("ref", [&] {
    std::vector<float> out(rows * cols);
    ef::WeightMatrix m{w.data(), w.size(), f, rows, cols, 0};
    ef::dequantize_rows(m, nullptr, rows, out.data());
    return out;
  });
}

}  // namespace eftest

int main(int argc, char** argv) {
  using namespace eftest;
  std::vector<std::string> expected;
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "--expect-isa" && i + 1 < argc) expected.emplace_back(argv[++i]);
  }
  const auto& cpu = ef::cpu_features();
  std::printf("arch %s, cpu flags:", cpu.arch.c_str());
  for (const auto& f : cpu.flags) std::printf(" %s", f.c_str());
  const auto isas = ef::available_isas();
  std::printf("\navailable levels:");
  for (const auto& i : isas) std::printf(" %s", i.c_str());
  std::printf("\n");
  for (const auto& e : expected)
    expect(std::find(isas.begin(), isas.end(), e) != isas.end(), "expected level " + e + " is not available here");

  test_thread_pool();
  std::printf("thread pool: %s\n", stats().failures == 0 ? "tasks ran concurrently on distinct threads" : "FAILURES");
  // The reference twin is batch invariant too (the SIMD levels are checked in the loop below).
  ef::use_isa("ref");
  {
    const int before = stats().failures;
    test_batch_invariance();
    std::printf("level %-13s: %s\n", "ref", stats().failures == before ? "GEMM batch invariant (1..70 tokens, 1 and 2 threads)" : "FAILURES");
  }
  int tested = 0;
  for (const auto& isa : isas) {
    if (isa == "ref") continue;
    ++tested;
    g_level = isa;
    for (int threads : {1, 2}) {
      ef::set_num_threads(threads);
      ef::use_isa(isa);
      const int before = stats().failures;
      test_linear();
      if (threads == 1) test_batch_invariance();  // runs itself at 1 and 2 threads
      test_ffn();
      test_attention();
      test_elementwise();
      test_errors();
      std::printf("level %-13s threads=%d: %s\n", isa.c_str(), threads,
                  stats().failures == before ? "all kernels match the reference" : "FAILURES");
    }
    std::printf("implementations exercised at level %s:", isa.c_str());
    for (const auto& s : g_impls[isa]) std::printf(" %s", s.c_str());
    std::printf("\n");
  }
  expect(tested > 0, "no SIMD level available: nothing but the reference would run");
  std::printf("%d checks, %d failures\n", stats().checks, stats().failures);
  return stats().failures == 0 ? 0 : 1;
}
