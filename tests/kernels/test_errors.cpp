// Bad calls throw ef::KernelError instead of touching memory out of bounds.
#include "test_util.h"

namespace eftest {
namespace {

template <class F>
void expect_throw(const std::string& what, F&& f) {
  bool thrown = false;
  try {
    f();
  } catch (const ef::KernelError&) {
    thrown = true;
  }
  expect(thrown, "no KernelError for " + what);
}

}  // namespace

void test_errors() {
  const int64_t rows = 4, cols = 64;
  auto w = random_weights(ef::Format::q4_0, rows, cols);
  std::vector<float> x(2 * cols, 1.0f), y(2 * rows);
  ef::WeightMatrix m{w.data(), w.size(), ef::Format::q4_0, rows, cols, 0};
  {  // column panels: q8_0 only, whole groups of 32 rows; the int8 product needs q8_0 columns
    const auto c = random_weights(ef::Format::q8_0, 64, 64);
    std::vector<uint8_t> out(c.size());
    std::vector<float> h(64), yc(64);
    expect_throw("pack_columns of q4_0", [&] { ef::pack_columns(m, out.data(), out.size()); });
    expect_throw("pack_columns of 40 rows", [&] {
      ef::pack_columns(ef::WeightMatrix{c.data(), c.size(), ef::Format::q8_0, 40, 64}, out.data(), out.size());
    });
    expect_throw("pack_columns into a short buffer", [&] {
      ef::pack_columns(ef::WeightMatrix{c.data(), c.size(), ef::Format::q8_0, 64, 64}, out.data(), out.size() - 1);
    });
    expect_throw("int8 product of q4_0 columns", [&] { ef::matmul_columns(m, h.data(), 1, yc.data(), ef::ColumnActs::q8); });
    expect_throw("column panels with f32 coefficients", [&] {
      ef::matmul_columns(ef::WeightMatrix{c.data(), c.size(), ef::Format::q8_0, 64, 64, 0, ef::Layout::panels}, h.data(), 1,
                         yc.data(), ef::ColumnActs::f32);
    });
  }
  ef::WeightMatrix short_buf = m;
  short_buf.size_bytes -= 1;
  expect_throw("a weight buffer one byte short", [&] { ef::matmul(short_buf, x.data(), 2, y.data()); });
  ef::WeightMatrix bad_cols = m;
  bad_cols.cols = 48;
  expect_throw("cols not a multiple of the block", [&] { ef::matmul(bad_cols, x.data(), 2, y.data()); });
  expect_throw("zero activation rows", [&] { ef::matmul(m, x.data(), 0, y.data()); });
  std::vector<int32_t> ids = {0, 4};
  expect_throw("a row index out of range", [&] { ef::matmul_rows(m, ids.data(), 2, x.data(), 1, y.data()); });

  // The panel layout.
  std::vector<uint8_t> pb(ef::panel_bytes(ef::Format::q4_0, rows, cols));
  ef::pack_panels(m, pb.data(), pb.size());
  ef::WeightMatrix mp{pb.data(), pb.size(), ef::Format::q4_0, rows, cols, 0, ef::Layout::panels};
  expect_throw("a panel output buffer one byte short", [&] { ef::pack_panels(m, pb.data(), pb.size() - 1); });
  expect_throw("packing a matrix already in panels", [&] { ef::pack_panels(mp, pb.data(), pb.size()); });
  ef::WeightMatrix mp_short = mp;
  mp_short.size_bytes -= 1;
  expect_throw("a panel buffer one byte short", [&] { ef::matmul(mp_short, x.data(), 2, y.data()); });
  ef::WeightMatrix mp_stride = mp;
  mp_stride.stride = 64;
  expect_throw("a row stride on a panel matrix", [&] { ef::matmul(mp_stride, x.data(), 2, y.data()); });
  expect_throw("listed rows of a panel matrix", [&] { ef::matmul_rows(mp, ids.data(), 1, x.data(), 1, y.data()); });
  auto half = random_weights(ef::Format::f16, rows, cols);
  const ef::WeightMatrix mh{half.data(), half.size(), ef::Format::f16, rows, cols, 0};
  std::vector<uint8_t> hp(ef::row_bytes(ef::Format::f16, cols) * 16);
  expect_throw("panels of a format without a panel layout", [&] { ef::pack_panels(mh, hp.data(), hp.size()); });

  ef::NeuronArena a{w.data(), w.size(), 1, cols, ef::Format::q4_0, ef::Format::q4_0, ef::Format::q4_0, 0};
  std::vector<int32_t> slots = {0, 1};
  std::vector<float> out(cols);
  expect_throw("an arena too small for its slots", [&] {
    ef::NeuronArena big = a;
    big.n_slots = 2;
    ef::ffn_sparse(big, x.data(), 1, slots.data(), 1, ef::Activation::silu, nullptr, out.data());
  });
  expect_throw("a slot outside the arena", [&] {
    ef::ffn_sparse(a, x.data(), 1, slots.data(), 2, ef::Activation::silu, nullptr, out.data());
  });

  std::vector<uint8_t> K(2 * 8 * 64 * 2), V(K.size());
  std::vector<int32_t> sp(8, -1);
  ef::KvCache c{K.data(), V.data(), K.size(), ef::Format::f16, 2, 8, 64, sp.data()};
  std::vector<float> kv(2 * 64);
  std::vector<int32_t> slot = {8}, pos = {0};
  expect_throw("a KV slot outside the cache", [&] { ef::kv_write(c, kv.data(), kv.data(), 1, slot.data(), pos.data()); });
  ef::KvCache small = c;
  small.size_bytes -= 2;
  slot[0] = 0;
  expect_throw("a KV buffer too small", [&] { ef::kv_write(small, kv.data(), kv.data(), 1, slot.data(), pos.data()); });
  std::vector<float> q(3 * 64), o(3 * 64);
  ef::AttentionArgs args;
  args.q = q.data(), args.n_q = 1, args.n_heads = 3, args.q_pos = pos.data(), args.out = o.data();
  expect_throw("n_heads not a multiple of n_kv_heads", [&] { ef::attention(c, args); });
  ef::RopeParams p;
  p.rot_dim = 65;
  expect_throw("an odd rot_dim", [&] { ef::rope(q.data(), 1, 3, 64, pos.data(), p); });
  expect_throw("k larger than the row", [&] { ef::topk(q.data(), 1, 4, 5, o.data(), slot.data()); });
  expect_throw("an unknown instruction set", [&] { ef::use_isa("sse9"); });
}

}  // namespace eftest
