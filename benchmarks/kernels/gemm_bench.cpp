// Small-batch GEMM speed at the real model shapes, through the C++ API the engine calls:
// ef::matmul(WeightMatrix, QuantizedActs, y) with activations quantized once outside the timing.
// Prints one line per case: "<model> <fmt> <rows>x<cols> n=<n> <us> us <GFLOP/s> GFLOP/s".
//
//   gemm_bench [--threads N] [--min-ms MS] [--n 1,2,4,16,64,128] [--only SUBSTRING] [--cpu-time]
//
// --cpu-time times with the calling thread's CPU clock instead of the wall clock (one thread
// only): on a shared machine it leaves out the time the thread was descheduled.
// Built against any kernels tree by benchmarks/kernels/gemm_compare.py (old vs new side by side).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <random>
#include <string>
#include <vector>

#include "edgeflash/kernels.h"

namespace {

struct Case {
  const char* model;
  const char* fmt;
  int64_t rows, cols;
};

// SmolLM2-135M (q4_1 file; q4_0 as the other 4-bit export) and Gemma 3 270M Q4_K_M: the
// formats each matrix has in the real files; the LM heads are q8_0 in both.
const Case kCases[] = {
    {"smollm2", "q4_1", 576, 576},     {"smollm2", "q4_1", 192, 576},    {"smollm2", "q4_1", 1536, 576},
    {"smollm2", "q4_1", 576, 1536},    {"smollm2", "q4_0", 576, 576},    {"smollm2", "q4_0", 192, 576},
    {"smollm2", "q4_0", 1536, 576},    {"smollm2", "q4_0", 576, 1536},   {"smollm2", "q8_0", 49152, 576},
    {"gemma3", "q5_0", 1024, 640},     {"gemma3", "q5_0", 256, 640},     {"gemma3", "q8_0", 256, 640},
    {"gemma3", "q4_k", 640, 1024},     {"gemma3", "q5_0", 2048, 640},    {"gemma3", "q6_k", 640, 2048},
    {"gemma3", "q4_k", 640, 2048},     {"gemma3", "q8_0", 262144, 640},
};

void put_half(uint8_t* p, float v) {
  const uint16_t h = ef::f32_to_fp16(v);
  std::memcpy(p, &h, 2);
}

// Valid weights with random codes and sane scales: the speed does not depend on the values.
std::vector<uint8_t> random_weights(ef::Format f, int64_t rows, int64_t cols, std::mt19937& rng) {
  const size_t rb = ef::row_bytes(f, cols);
  std::vector<uint8_t> w(rb * rows);
  std::uniform_int_distribution<uint32_t> word;
  for (size_t i = 0; i + 4 <= w.size(); i += 4) {
    const uint32_t v = word(rng);
    std::memcpy(w.data() + i, &v, 4);
  }
  const auto& info = ef::format_info(f);
  for (int64_t r = 0; r < rows; ++r) {
    uint8_t* row = w.data() + r * rb;
    if (f == ef::Format::q4_lut) {
      const float s = 0.001f;
      std::memcpy(row, &s, 4);
      std::memset(row + 20, 0, 12);
      row += 32;
    }
    for (int64_t b = 0; b < cols / info.block_elems; ++b) {
      uint8_t* blk = row + b * info.block_bytes;
      switch (f) {
        case ef::Format::q4_1: put_half(blk + 2, -0.08f); [[fallthrough]];
        case ef::Format::q8_0:
        case ef::Format::q4_0:
        case ef::Format::q5_0: put_half(blk, 0.01f); break;
        case ef::Format::q4_k: put_half(blk, 0.001f), put_half(blk + 2, 0.001f); break;
        case ef::Format::q6_k: put_half(blk + 208, 0.0002f); break;
        case ef::Format::q3_k: put_half(blk + 108, 0.0002f); break;
        default: break;
      }
    }
  }
  return w;
}

double now(bool cpu) {
  if (cpu) {
    timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Median seconds per call: repeats until min_s of calls have run (at least 5).
template <class F>
double median_time(F&& fn, double min_s, bool cpu) {
  fn();
  std::vector<double> t;
  const double start = now(false);
  while (t.size() < 5 || (now(false) - start < min_s && t.size() < 20000)) {
    const double t0 = now(cpu);
    fn();
    t.push_back(now(cpu) - t0);
  }
  std::nth_element(t.begin(), t.begin() + t.size() / 2, t.end());
  return t[t.size() / 2];
}

std::vector<int64_t> parse_list(const char* s) {
  std::vector<int64_t> out;
  for (const char* p = s; *p;) {
    out.push_back(std::strtoll(p, const_cast<char**>(&p), 10));
    if (*p == ',') ++p;
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 1;
  double min_ms = 200;
  bool cpu = false;
  std::string only;
  std::vector<int64_t> ns = {1, 2, 4, 16, 64, 128};
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "gemm_bench: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--threads") threads = std::atoi(next());
    else if (a == "--min-ms") min_ms = std::atof(next());
    else if (a == "--n") ns = parse_list(next());
    else if (a == "--only") only = next();
    else if (a == "--cpu-time") cpu = true;
    else {
      std::fprintf(stderr, "gemm_bench: unknown argument %s (see the header of gemm_bench.cpp)\n", a.c_str());
      return 2;
    }
  }
  if (cpu && threads != 1) {
    std::fprintf(stderr, "gemm_bench: --cpu-time measures one thread; use --threads 1\n");
    return 2;
  }
  ef::set_num_threads(threads);
  std::mt19937 rng(1234);
  std::printf("# level %s, threads %d, timing %s\n", ef::current_isa().c_str(), threads, cpu ? "thread CPU" : "wall");
  for (const Case& c : kCases) {
    char name[96];
    std::snprintf(name, sizeof name, "%s %s %lldx%lld", c.model, c.fmt, static_cast<long long>(c.rows),
                  static_cast<long long>(c.cols));
    if (!only.empty() && std::string(name).find(only) == std::string::npos) continue;
    ef::Format f;
    ef::parse_format(c.fmt, &f);
    const auto wb = random_weights(f, c.rows, c.cols, rng);
    const ef::WeightMatrix w{wb.data(), wb.size(), f, c.rows, c.cols, 0};
    const int64_t n_max = *std::max_element(ns.begin(), ns.end());
    std::vector<float> x(n_max * c.cols), y(n_max * c.rows);
    std::normal_distribution<float> nd;
    for (float& v : x) v = nd(rng);
    for (int64_t n : ns) {
      ef::QuantizedActs xq;
      xq.quantize(x.data(), n, c.cols);
      const double s = median_time([&] { ef::matmul(w, xq, y.data()); }, min_ms / 1e3, cpu);
      std::printf("%s n=%lld %.2f us %.1f GFLOP/s\n", name, static_cast<long long>(n), s * 1e6,
                  2.0 * c.rows * c.cols * n / s / 1e9);
      std::fflush(stdout);
    }
  }
  return 0;
}
