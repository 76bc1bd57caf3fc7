// Decode-step GEMV at the real model shapes, as a token sees them: every weight matrix of a model
// (layers in order, then the head) multiplied once by one token's activations, with the formats the
// real GGUF files use. The whole set is far larger than the caches, so every matrix streams from
// DRAM, unlike a benchmark that repeats one matrix. Prints GB/s of weight bytes per role and for
// the whole sweep next to the machine's streaming-read bandwidth (ef::timed_read).
//
//   decode_sweep --model qwen1.5b [--threads 2] [--rounds 8] [--n 1] [--fmt q4_0] [--layout rows|panels|both]
//
// --fmt replaces every matrix format (e.g. q4_0 as a q4_0 bundle has it); --layout rows keeps the
// GGUF row layout, panels lays matrices out as the engine does at load where the level prefers it,
// both (the default) runs the two alternately in one process and prints their ratio. --cpu-time
// --isa picks a level (e.g. avx2). --cached runs two layers and 4096 head rows, each matrix 20 times in a row: the kernels' speed from
// the caches, what they can do when memory keeps up. --cpu-time
// (one thread) times with the thread's CPU clock, which leaves out time the thread was descheduled
// on a shared machine (stalls on memory still count).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "edgeflash/kernels.h"

namespace {

struct Shape {
  const char* name;
  int64_t layers, d, q, kv, ff, vocab;
  // formats: q, k, v (even layers / odd layers), o, gate, up, down (even / odd), head
  const char *fq, *fk, *fv0, *fv1, *fo, *fg, *fu, *fd0, *fd1, *fh;
};

// The formats of the real Q4_K_M files (Qwen2.5-Coder, Gemma 3) and SmolLM2's Q4_1 file; Q4_K_M
// gives half the layers' v and down more bits.
const Shape kShapes[] = {
    {"smollm2", 30, 576, 576, 192, 1536, 49152, "q4_1", "q4_1", "q4_1", "q4_1", "q4_1", "q4_1", "q4_1", "q4_1",
     "q4_1", "q8_0"},
    {"gemma3", 18, 640, 1024, 256, 2048, 262144, "q5_0", "q5_0", "q5_0", "q8_0", "q4_k", "q5_0", "q5_0", "q4_k",
     "q6_k", "q8_0"},
    {"qwen0.5b", 24, 896, 896, 128, 4864, 151936, "q5_0", "q5_0", "q5_0", "q8_0", "q5_0", "q5_0", "q5_0", "q4_k",
     "q6_k", "q8_0"},
    {"qwen1.5b", 28, 1536, 1536, 256, 8960, 151936, "q4_k", "q4_k", "q4_k", "q6_k", "q4_k", "q4_k", "q4_k", "q4_k",
     "q6_k", "q6_k"},
    {"qwen7b", 28, 3584, 3584, 512, 18944, 152064, "q4_k", "q4_k", "q4_k", "q6_k", "q4_k", "q4_k", "q4_k", "q4_k",
     "q6_k", "q6_k"},
};

void put_half(uint8_t* p, float v) {
  const uint16_t h = ef::f32_to_fp16(v);
  std::memcpy(p, &h, 2);
}

// Valid weights with random codes and sane scales (speed does not depend on the values).
void fill_random(ef::Format f, int64_t rows, int64_t cols, uint8_t* w, std::mt19937& rng) {
  const size_t rb = ef::row_bytes(f, cols);
  std::uniform_int_distribution<uint32_t> word;
  for (size_t i = 0; i + 4 <= rb * rows; i += 4) {
    const uint32_t v = word(rng);
    std::memcpy(w + i, &v, 4);
  }
  const auto& info = ef::format_info(f);
  for (int64_t r = 0; r < rows; ++r) {
    uint8_t* row = w + r * rb;
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
}

struct Matrix {
  std::string role;
  ef::Format fmt;
  int64_t rows, cols;
  std::unique_ptr<uint8_t[]> raw, packed;
  ef::WeightMatrix w[2];  // [0] row layout, [1] panels where preferred (else the row layout)
  size_t bytes;
};

bool g_cpu_time = false;  // time with the thread's CPU clock (one thread): leaves out descheduled time

double now() {
  if (g_cpu_time) {
    timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

ef::Format fmt_of(const char* name) {
  ef::Format f;
  if (!ef::parse_format(name, &f)) {
    std::fprintf(stderr, "decode_sweep: unknown format %s\n", name);
    std::exit(2);
  }
  return f;
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 2, rounds = 8;
  int64_t n = 1;
  std::string model = "qwen0.5b", fmt_override, layout = "both";
  bool cached = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "decode_sweep: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--threads") threads = std::atoi(next());
    else if (a == "--rounds") rounds = std::atoi(next());
    else if (a == "--n") n = std::atoll(next());
    else if (a == "--model") model = next();
    else if (a == "--fmt") fmt_override = next();
    else if (a == "--layout") layout = next();
    else if (a == "--cpu-time") g_cpu_time = true;
    else if (a == "--cached") cached = true;
    else if (a == "--isa") ef::use_isa(next());
    else {
      std::fprintf(stderr, "decode_sweep: unknown argument %s (see the header of decode_sweep.cpp)\n", a.c_str());
      return 2;
    }
  }
  const Shape* s = nullptr;
  for (const Shape& c : kShapes)
    if (model == c.name) s = &c;
  if (!s) {
    std::fprintf(stderr, "decode_sweep: unknown model %s (smollm2, gemma3, qwen0.5b, qwen1.5b, qwen7b)\n",
                 model.c_str());
    return 2;
  }
  if (g_cpu_time && threads != 1) {
    std::fprintf(stderr, "decode_sweep: --cpu-time measures one thread; use --threads 1\n");
    return 2;
  }
  if (layout != "rows" && layout != "panels" && layout != "both") {
    std::fprintf(stderr, "decode_sweep: --layout is rows, panels or both\n");
    return 2;
  }
  ef::set_num_threads(threads);
  std::mt19937 rng(1234);
  std::vector<Matrix> ms;
  auto add = [&](const char* role, const char* fmt, int64_t rows, int64_t cols) {
    Matrix m;
    m.role = role;
    m.fmt = fmt_override.empty() ? fmt_of(fmt) : fmt_of(fmt_override.c_str());
    m.rows = rows, m.cols = cols;
    const size_t bytes = ef::row_bytes(m.fmt, cols) * rows;
    m.raw.reset(new uint8_t[bytes]);
    fill_random(m.fmt, rows, cols, m.raw.get(), rng);
    m.w[0] = m.w[1] = ef::WeightMatrix{m.raw.get(), bytes, m.fmt, rows, cols, 0};
    m.bytes = bytes;
    if (layout != "rows" && ef::prefers_panels(m.fmt)) {
      const size_t pb = ef::panel_bytes(m.fmt, rows, cols);
      m.packed.reset(new uint8_t[pb]);
      ef::pack_panels(m.w[0], m.packed.get(), pb);
      m.w[1] = ef::WeightMatrix{m.packed.get(), pb, m.fmt, rows, cols, 0, ef::Layout::panels};
      if (layout == "panels") m.raw.reset();
    }
    ms.push_back(std::move(m));
  };
  for (int64_t l = 0; l < (cached ? 2 : s->layers); ++l) {
    add("q", s->fq, s->q, s->d);
    add("k", s->fk, s->kv, s->d);
    add("v", l % 2 ? s->fv1 : s->fv0, s->kv, s->d);
    add("o", s->fo, s->d, s->q);
    add("gate", s->fg, s->ff, s->d);
    add("up", s->fu, s->ff, s->d);
    add("down", l % 2 ? s->fd1 : s->fd0, s->d, s->ff);
  }
  add("head", s->fh, cached ? 4096 : s->vocab, s->d);
  size_t total = 0;
  for (const Matrix& m : ms) total += m.bytes;
  const int reps = cached ? 20 : 1;
  const int64_t max_cols = std::max(s->ff, std::max(s->d, s->q));
  std::vector<float> x(n * max_cols), y(n * std::max<int64_t>(s->vocab, s->ff));
  std::normal_distribution<float> nd;
  for (float& v : x) v = nd(rng);
  std::map<int64_t, ef::QuantizedActs> acts;
  for (const Matrix& m : ms)
    if (!acts.count(m.cols)) acts[m.cols].quantize(x.data(), n, m.cols);

  std::vector<uint8_t> probe(size_t(1) << 30, 1);
  double read_s = 1e9;
  for (int i = 0; i < 5; ++i) read_s = std::min(read_s, ef::timed_read(probe.data(), probe.size()));
  probe = std::vector<uint8_t>();
  const double bw = (size_t(1) << 30) / read_s / 1e9;

  std::vector<int> layouts;
  if (layout != "panels") layouts.push_back(0);
  if (layout != "rows") layouts.push_back(1);
  std::map<std::string, std::vector<double>> role_s[2];
  std::vector<double> sweep_s[2];
  for (int r = 0; r < rounds + 1; ++r) {
    for (int li : layouts) {  // alternately, so load from other processes hits both alike
      std::map<std::string, double> t_role;
      const double t0 = now();
      for (const Matrix& m : ms) {
        const double a = now();
        for (int rep = 0; rep < reps; ++rep) ef::matmul(m.w[li], acts[m.cols], y.data());
        t_role[m.role] += (now() - a) / reps;
      }
      if (r == 0) continue;  // the first sweep pages everything in
      sweep_s[li].push_back((now() - t0) / reps);
      for (auto& [role, t] : t_role) role_s[li][role].push_back(t);
    }
  }
  auto median = [](std::vector<double> v) {
    std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
    return v[v.size() / 2];
  };
  std::map<std::string, size_t> role_bytes;
  for (const Matrix& m : ms) role_bytes[m.role] += m.bytes;
  std::printf("# %s, level %s, %d threads, n=%lld, read bandwidth %.1f GB/s, %d rounds (medians)\n", s->name,
              ef::current_isa().c_str(), threads, static_cast<long long>(n), bw, rounds);
  for (int li : layouts) {
    const double sw = median(sweep_s[li]);
    std::printf("%s: sweep %.1f MB %.3f ms %.1f GB/s (%.0f%% of read bandwidth)\n",
                li ? "panels where preferred" : "row layout", total / 1e6, sw * 1e3, total / sw / 1e9,
                100.0 * total / sw / 1e9 / bw);
    for (auto& [role, t] : role_s[li]) {
      const double m = median(t);
      std::printf("  %-5s %8.1f MB %8.3f ms %6.1f GB/s\n", role.c_str(), role_bytes[role] / 1e6, m * 1e3,
                  role_bytes[role] / m / 1e9);
    }
  }
  if (layouts.size() == 2) {
    std::vector<double> ratio;
    for (size_t i = 0; i < sweep_s[0].size(); ++i) ratio.push_back(sweep_s[0][i] / sweep_s[1][i]);
    std::printf("panels vs rows: %.2fx faster (median of per-round ratios)\n", median(ratio));
  }
  return 0;
}
