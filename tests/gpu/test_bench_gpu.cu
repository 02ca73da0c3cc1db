// benchmark_sm90 (`fp4attn bench`, the throughput part of `fp4attn run`) on a
// Hopper GPU: with training on it times forward + backward and the backward
// alone next to the forward rows, Direct-P on and off, every row a positive
// time, and the backward alone shorter than forward + backward.
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <utility>

#include "fp4attn/attention.hpp"
#include "fp4attn/error.hpp"
#include "gpu/gpu_test_util.hpp"

namespace fp4attn {
namespace {

TEST(GpuBench, TrainingRowsFollowTheForwardRows) {
  FP4ATTN_REQUIRE_HOPPER();
  const AttentionShape shape{.B = 1, .Hq = 4, .Hkv = 2, .Sq = 300, .Sk = 257, .D = 128};
  for (const MaskKind mask : {MaskKind::none, MaskKind::causal}) {
    BenchOptions opt;
    opt.mask = mask;
    opt.reps = 3;
    opt.warmup = 1;
    opt.training = true;
    const Sm90Benchmark result = benchmark_sm90(shape, opt);
    ASSERT_EQ(result.timings.size(), 8u);
    std::set<std::pair<std::string, bool>> seen;
    for (const Timing& t : result.timings) {
      seen.insert({std::string(to_string(t.op)), t.direct_p});
      EXPECT_GT(t.ms, 0.0) << to_string(t.op);
    }
    EXPECT_EQ(seen.size(), 8u);
    const auto ms = [&](TimedOp op, bool direct_p) {
      for (const Timing& t : result.timings)
        if (t.op == op && t.direct_p == direct_p) return t.ms;
      return 0.0;
    };
    for (const bool direct_p : {true, false}) EXPECT_LT(ms(TimedOp::bwd, direct_p), ms(TimedOp::fwdbwd, direct_p));
    // Without training, the four forward rows alone.
    opt.training = false;
    EXPECT_EQ(benchmark_sm90(shape, opt).timings.size(), 4u);
  }
}

// D = 256 has recipe fp8's forward kernel only: the four forward rows, and
// training is refused naming the option.
TEST(GpuBench, HeadDim256TimesTheForwardOnly) {
  FP4ATTN_REQUIRE_HOPPER();
  const AttentionShape shape{.B = 1, .Hq = 4, .Hkv = 2, .Sq = 300, .Sk = 257, .D = 256};
  BenchOptions opt;
  opt.reps = 3;
  opt.warmup = 1;
  const Sm90Benchmark result = benchmark_sm90(shape, opt);
  ASSERT_EQ(result.timings.size(), 4u);
  for (const Timing& t : result.timings) EXPECT_GT(t.ms, 0.0) << to_string(t.op);
  opt.training = true;
  try {
    benchmark_sm90(shape, opt);
    FAIL() << "training at D = 256 was timed";
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), "training");
  }
}

}  // namespace
}  // namespace fp4attn
