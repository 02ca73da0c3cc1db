// forward_e4m3 on the emulator: caller-quantized E4M3 inputs with
// FlashAttention-3's per-(batch, kv head) descales. The result is attention of
// the values the codes stand for (against fp64), each descale scales its own
// tensor, and bad input is refused naming the argument.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "e4m3_inputs_fixture.hpp"
#include "fp4attn/attention.hpp"
#include "fp4attn/error.hpp"
#include "fp4attn/metrics.hpp"
#include "fp4attn/reference.hpp"

namespace fp4attn {
namespace {

using e4m3_test::Problem;
using e4m3_test::random_problem;

AttentionOptions e4m3_options(MaskKind mask) {
  AttentionOptions opt;
  opt.recipe = Recipe::fp8;
  opt.smooth_k = false;
  opt.mask = mask;
  opt.threads = 2;
  return opt;
}

// Recipe fp8's only error on exact E4M3 inputs is P's E4M3 rounding (each P
// value within 2^-4 relative): 2.0–2.7 % rel L2 in O and up to 0.021 in the
// LSE on these cases. A descale taken from another head changes the scores or
// V by factors of 2 to 128 (random_descales' range), far past these bounds.
constexpr double kMaxRelL2 = 0.04;
constexpr double kMaxLseDiff = 0.04;

void expect_close_to_fp64(const Problem& p, const ForwardOutput& got, MaskKind mask, const std::string& where) {
  const AttentionShape& s = p.shape;
  const std::int64_t group = s.Hq / s.Hkv;
  const reference::ForwardResult want =
      reference::forward(s, p.values(p.q, p.q_descale, s.Sq, s.Hq, group), p.values(p.k, p.k_descale, s.Sk, s.Hkv, 1),
                         p.values(p.v, p.v_descale, s.Sk, s.Hkv, 1), mask, 0.0);
  const ErrorMetrics m = compare(got.o, want.o);
  EXPECT_EQ(m.nonfinite_mismatch, 0) << where;
  EXPECT_LE(m.rel_l2, kMaxRelL2) << where;
  double max_lse = 0.0;
  for (std::size_t i = 0; i < want.lse.size(); ++i) {
    if (std::isinf(want.lse[i])) {
      EXPECT_EQ(got.lse[i], want.lse[i]) << where << " row " << i;
      continue;
    }
    max_lse = std::max(max_lse, std::fabs(got.lse[i] - want.lse[i]));
  }
  EXPECT_LE(max_lse, kMaxLseDiff) << where;
  std::printf("[ e4m3 vs fp64 ] %s: O rel L2 %.3g, max |dLSE| %.3g\n", where.c_str(), m.rel_l2, max_lse);
}

TEST(ForwardE4m3, IsAttentionOfTheDescaledCodes) {
  struct Case {
    AttentionShape shape;
    MaskKind mask;
  };
  const Case cases[] = {
      {{2, 4, 2, 150, 260, 64}, MaskKind::none},
      {{2, 4, 2, 150, 260, 64}, MaskKind::causal},        // bottom-right, Sq < Sk
      {{1, 6, 2, 300, 200, 128}, MaskKind::causal},       // Sq > Sk: leading rows see no key
      {{1, 2, 1, 129, 333, 48}, MaskKind::none},          // a head dim below the emulator's 32-channel blocks
  };
  std::uint32_t seed = 11;
  for (const Case& c : cases) {
    const Problem p = random_problem(c.shape, seed++);
    const ForwardOutput got = forward_e4m3(c.shape, p.inputs(), e4m3_options(c.mask), Executor::emulator);
    EXPECT_EQ(got.executor, Executor::emulator);
    expect_close_to_fp64(p, got, c.mask,
                         "D " + std::to_string(c.shape.D) + " Sq " + std::to_string(c.shape.Sq) + " mask " +
                             (c.mask == MaskKind::none ? "none" : "causal"));
  }
}

// Powers of two move through the products exactly: V's descale doubled doubles
// O bit for bit, and Q's doubled with the softmax scale halved leaves O and
// the LSE unchanged; K's likewise against Q's.
TEST(ForwardE4m3, EachDescaleScalesItsOwnTensor) {
  const AttentionShape shape{2, 4, 2, 100, 180, 64};
  const Problem base = random_problem(shape, 5);
  AttentionOptions opt = e4m3_options(MaskKind::none);
  opt.softmax_scale = 0.125f;
  const ForwardOutput ref = forward_e4m3(shape, base.inputs(), opt, Executor::emulator);

  Problem v2 = base;
  for (float& x : v2.v_descale) x *= 2.0f;
  const ForwardOutput got_v = forward_e4m3(shape, v2.inputs(), opt, Executor::emulator);
  for (std::size_t i = 0; i < ref.o.size(); ++i) ASSERT_EQ(got_v.o[i], 2.0f * ref.o[i]) << "O[" << i << "]";
  EXPECT_EQ(got_v.lse, ref.lse);

  Problem q2 = base;
  for (float& x : q2.q_descale) x *= 2.0f;
  AttentionOptions half = opt;
  half.softmax_scale = 0.0625f;
  const ForwardOutput got_q = forward_e4m3(shape, q2.inputs(), half, Executor::emulator);
  EXPECT_EQ(got_q.o, ref.o);
  EXPECT_EQ(got_q.lse, ref.lse);

  Problem k4 = base;
  for (float& x : k4.k_descale) x *= 4.0f;
  for (float& x : k4.q_descale) x *= 0.25f;
  const ForwardOutput got_k = forward_e4m3(shape, k4.inputs(), opt, Executor::emulator);
  EXPECT_EQ(got_k.o, ref.o);

  // And a descale is not ignored: Q's doubled alone changes O.
  const ForwardOutput changed = forward_e4m3(shape, q2.inputs(), opt, Executor::emulator);
  EXPECT_NE(changed.o, ref.o);
}

// No descale means 1: the same as descales of ones.
TEST(ForwardE4m3, MissingDescalesAreOne) {
  const AttentionShape shape{1, 2, 2, 70, 90, 64};
  Problem p = random_problem(shape, 9);
  for (auto* d : {&p.q_descale, &p.k_descale, &p.v_descale}) d->assign(d->size(), 1.0f);
  const AttentionOptions opt = e4m3_options(MaskKind::causal);
  const ForwardOutput ones = forward_e4m3(shape, p.inputs(), opt, Executor::emulator);
  const E4m3Inputs none{p.q, p.k, p.v, {}, {}, {}};
  const ForwardOutput missing = forward_e4m3(shape, none, opt, Executor::emulator);
  EXPECT_EQ(missing.o, ones.o);
  EXPECT_EQ(missing.lse, ones.lse);
}

template <class F>
std::string argument_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.argument();
  }
  return "(no error)";
}

TEST(ForwardE4m3, RefusesBadInputByName) {
  const AttentionShape shape{1, 2, 1, 40, 50, 64};
  const Problem p = random_problem(shape, 3);
  const AttentionOptions opt = e4m3_options(MaskKind::none);
  const auto run = [&](const Problem& x, const AttentionOptions& o, const AttentionShape& s = {1, 2, 1, 40, 50, 64}) {
    return [x, o, s] { forward_e4m3(s, x.inputs(), o, Executor::emulator); };
  };

  Problem nan_k = p;
  nan_k.k[7] = 0x7F;
  EXPECT_EQ(argument_of(run(nan_k, opt)), "k");
  Problem neg_nan_v = p;
  neg_nan_v.v[3] = 0xFF;
  EXPECT_EQ(argument_of(run(neg_nan_v, opt)), "v");
  Problem zero_descale = p;
  zero_descale.v_descale[0] = 0.0f;
  EXPECT_EQ(argument_of(run(zero_descale, opt)), "v_descale");
  Problem inf_descale = p;
  inf_descale.q_descale[0] = INFINITY;
  EXPECT_EQ(argument_of(run(inf_descale, opt)), "q_descale");
  Problem wrong_count = p;
  wrong_count.k_descale.push_back(1.0f);
  EXPECT_EQ(argument_of(run(wrong_count, opt)), "k_descale");
  Problem short_q = p;
  short_q.q.pop_back();
  EXPECT_EQ(argument_of(run(short_q, opt)), "q");

  AttentionOptions smooth = opt;
  smooth.smooth_k = true;
  EXPECT_EQ(argument_of(run(p, smooth)), "smooth_k");
  AttentionOptions mx = opt;
  mx.recipe = Recipe::mxfp4;
  EXPECT_EQ(argument_of(run(p, mx)), "recipe");
  const AttentionShape d24{1, 2, 1, 40, 50, 24};
  const Problem narrow = random_problem(d24, 4);
  EXPECT_EQ(argument_of(run(narrow, opt, d24)), "D");
}

}  // namespace
}  // namespace fp4attn
