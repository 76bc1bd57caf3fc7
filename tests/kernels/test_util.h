// Small test harness for the kernel suite: random data, tolerance checks, failure accounting.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "edgeflash/kernels.h"

namespace eftest {

struct Stats {
  int checks = 0;
  int failures = 0;
};
Stats& stats();

// Reports one comparison; returns false (and counts a failure) when it does not hold.
bool expect(bool ok, const std::string& what);

// Largest |a - b| / (scale + tiny), where scale comes from the caller (per element or global).
struct ErrReport {
  double max_err = 0.0;
  int64_t worst = -1;
};
ErrReport rel_err(const std::vector<float>& got, const std::vector<float>& want, const std::vector<double>& scale,
                  double floor = 1e-30);

// The level under test (set by main) and a helper that runs f under a given level, then goes back
// to the level it was called at.
const std::string& level();
template <class F>
auto under(const std::string& isa, F&& f) {
  const std::string before = ef::current_isa();
  ef::use_isa(isa);
  auto r = f();
  ef::use_isa(before);
  return r;
}

// Runs f at the reference level on one thread. A test builds its cases this way once (inputs,
// the reference twin's outputs, exact math) and checks every level and thread count against them:
// the same inputs everywhere, and a reference that is not recomputed for each level and thread count.
template <class F>
auto reference(F&& f) {
  const int threads = ef::get_num_threads();
  ef::set_num_threads(1);
  auto r = under("ref", f);
  ef::set_num_threads(threads);
  return r;
}

// Records which implementation a kernel ran with at the level under test and fails on "ref".
void note_impl(const std::string& kernel);

std::mt19937& rng();
std::vector<float> randn(size_t n, float scale = 1.0f);
// A random but valid [rows, row_bytes] weight matrix: codes random, scale fields sane.
std::vector<uint8_t> random_weights(ef::Format f, int64_t rows, int64_t cols);
// Dequantized with the reference twin (double precision oracle input).
std::vector<float> ref_dequant(ef::Format f, const std::vector<uint8_t>& w, int64_t rows, int64_t cols);

void test_linear();
void test_batch_invariance();
void test_ffn();
void test_attention();
void test_elementwise();
void test_errors();
void test_thread_pool();

}  // namespace eftest
