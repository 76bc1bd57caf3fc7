// Batch invariance of the quantized GEMM: a token's output row is bit-identical whatever the
// number of tokens in the call (1..70), where the token sits in the batch, the thread count, and
// which rows are computed with it. Prefill-equals-decode and exact speculative verification
// depend on this, so it is checked bit for bit, not within a tolerance.
#include <algorithm>
#include <numeric>

#include "test_util.h"

namespace eftest {
namespace {

constexpr int64_t kMaxTokens = 70;

bool same_bits(const float* a, const float* b, size_t count) { return std::memcmp(a, b, count * sizeof(float)) == 0; }

}  // namespace

void test_batch_invariance() {
  using ef::Format;
  const int threads_before = ef::get_num_threads();
  for (Format f : {Format::q8_0, Format::q4_0, Format::q4_1, Format::q5_0, Format::q4_k, Format::q6_k, Format::q3_k, Format::q4_lut}) {
    const std::string fmt = ef::format_info(f).name;
    // 37 rows: two full 16-row panels and a partial one; columns with an odd number of blocks
    // (and of 4-block groups) and, for the K-quants, two super-blocks.
    const int64_t rows = 37, cols = ef::format_info(f).block_elems == 256 ? 512 : 608;
    const auto wb = random_weights(f, rows, cols);
    const ef::WeightMatrix w{wb.data(), wb.size(), f, rows, cols, 0};
    const auto x = randn(kMaxTokens * cols, 2.0f);

    // Reference: all 70 tokens in one call on one thread.
    ef::set_num_threads(1);
    std::vector<float> full(kMaxTokens * rows);
    ef::matmul(w, x.data(), kMaxTokens, full.data());

    bool ok = true;
    std::string where;
    for (int threads : {1, 2}) {
      ef::set_num_threads(threads);
      std::vector<float> y(kMaxTokens * rows);
      for (int64_t n = 1; n <= kMaxTokens && ok; ++n) {
        // The first n tokens, and the last n (every token at a different place in its tile).
        for (const int64_t start : {int64_t{0}, kMaxTokens - n}) {
          ef::matmul(w, x.data() + start * cols, n, y.data());
          if (!same_bits(y.data(), full.data() + start * rows, static_cast<size_t>(n * rows))) {
            ok = false;
            where = "n=" + std::to_string(n) + " start=" + std::to_string(start) + " threads=" + std::to_string(threads);
            break;
          }
        }
      }
    }
    expect(ok, "matmul " + fmt + " is not batch invariant: " + where + " differs from the 70-token call");

    // The same in the panel layout (its kernels pair or tile tokens differently from the rows').
    if (ef::has_panels(f)) {
      std::vector<uint8_t> pb(ef::panel_bytes(f, rows, cols));
      ef::pack_panels(w, pb.data(), pb.size());
      const ef::WeightMatrix wp{pb.data(), pb.size(), f, rows, cols, 0, ef::Layout::panels};
      ef::set_num_threads(1);
      std::vector<float> pfull(kMaxTokens * rows), y(kMaxTokens * rows);
      ef::matmul(wp, x.data(), kMaxTokens, pfull.data());
      for (int threads : {1, 2}) {
        ef::set_num_threads(threads);
        for (int64_t n = 1; n <= kMaxTokens && ok; ++n)
          for (const int64_t start : {int64_t{0}, kMaxTokens - n}) {
            ef::matmul(wp, x.data() + start * cols, n, y.data());
            if (ok && !same_bits(y.data(), pfull.data() + start * rows, static_cast<size_t>(n * rows))) {
              ok = false;
              where = "n=" + std::to_string(n) + " start=" + std::to_string(start) + " threads=" +
                      std::to_string(threads);
            }
          }
      }
      expect(ok, "matmul on panels " + fmt + " is not batch invariant: " + where + " differs from the 70-token call");
    }

    // The same rows computed with other rows around them (a reversed gather puts every row in
    // another panel lane), on 2 threads, at 1, 9 and 70 tokens.
    std::vector<int32_t> ids(rows);
    std::iota(ids.begin(), ids.end(), 0);
    std::reverse(ids.begin(), ids.end());
    ok = true;
    for (int64_t n : {int64_t{1}, int64_t{9}, kMaxTokens}) {
      std::vector<float> part(n * rows);
      ef::matmul_rows(w, ids.data(), rows, x.data(), n, part.data());
      for (int64_t t = 0; t < n; ++t)
        for (int64_t i = 0; i < rows; ++i) ok &= part[t * rows + i] == full[t * rows + ids[i]];
    }
    expect(ok, "matmul_rows " + fmt + ": a row's result depends on the rows gathered with it");
  }
  ef::set_num_threads(threads_before);
}

}  // namespace eftest
