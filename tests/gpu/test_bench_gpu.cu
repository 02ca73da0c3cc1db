// benchmark_sm90 (`fp4attn bench`, the throughput part of `fp4attn run`) on a
// Hopper GPU: with training on it times forward + backward and the backward
// alone next to the forward rows, Direct-P on and off, every row a positive
// time, and the backward alone shorter than forward + backward; a window
// reaches the kernels; the forward rows include caller-quantized E4M3 inputs.
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
    ASSERT_EQ(result.timings.size(), 10u);
    std::set<std::pair<std::string, bool>> seen;
    for (const Timing& t : result.timings) {
      seen.insert({std::string(to_string(t.op)), t.direct_p});
      EXPECT_GT(t.ms, 0.0) << to_string(t.op);
    }
    EXPECT_EQ(seen.size(), 10u);
    const auto ms = [&](TimedOp op, bool direct_p) {
      for (const Timing& t : result.timings)
        if (t.op == op && t.direct_p == direct_p) return t.ms;
      return 0.0;
    };
    for (const bool direct_p : {true, false}) EXPECT_LT(ms(TimedOp::bwd, direct_p), ms(TimedOp::fwdbwd, direct_p));
    // Without training, the six forward rows alone (fwd, fwd_e2e, fwd_e4m3).
    opt.training = false;
    EXPECT_EQ(benchmark_sm90(shape, opt).timings.size(), 6u);
  }
}

// A causal window of 256 keys at S = 8k leaves about a sixteenth of the
// causal pairs: the windowed forward and training rows must be much faster
// than the same rows without the window (the window reaches the kernels), and
// a window on the backward picks its mode from the windowed problem.
TEST(GpuBench, WindowCutsTheWork) {
  FP4ATTN_REQUIRE_HOPPER();
  const AttentionShape shape{.B = 1, .Hq = 8, .Hkv = 8, .Sq = 8192, .Sk = 8192, .D = 128};
  BenchOptions opt;
  opt.mask = MaskKind::causal;
  opt.reps = 5;
  opt.warmup = 2;
  opt.training = true;
  const Sm90Benchmark full = benchmark_sm90(shape, opt);
  opt.window = {256, 0};
  const Sm90Benchmark windowed = benchmark_sm90(shape, opt);
  ASSERT_EQ(full.timings.size(), windowed.timings.size());
  for (std::size_t i = 0; i < full.timings.size(); ++i) {
    const Timing& f = full.timings[i];
    const Timing& w = windowed.timings[i];
    ASSERT_EQ(f.op, w.op);
    // fwd_e2e keeps the quantizer's full pass over Q, K and V, fwd_e4m3 its preparation pass.
    const double at_least = f.op == TimedOp::fwd_e2e || f.op == TimedOp::fwd_e4m3 ? 1.5 : 3.0;
    EXPECT_GT(f.ms / w.ms, at_least) << to_string(f.op) << " direct_p " << f.direct_p << ": " << f.ms << " ms "
                                     << "without the window, " << w.ms << " with it";
  }
  opt.window = {256, 5};  // a causal mask takes no right bound past the diagonal
  try {
    benchmark_sm90(shape, opt);
    FAIL() << "a causal window with right bound 5 was timed";
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), "window_right");
  }
}

// D = 256 has recipe fp8's forward kernel only: the six forward rows, and
// training is refused naming the option.
TEST(GpuBench, HeadDim256TimesTheForwardOnly) {
  FP4ATTN_REQUIRE_HOPPER();
  const AttentionShape shape{.B = 1, .Hq = 4, .Hkv = 2, .Sq = 300, .Sk = 257, .D = 256};
  BenchOptions opt;
  opt.reps = 3;
  opt.warmup = 1;
  const Sm90Benchmark result = benchmark_sm90(shape, opt);
  ASSERT_EQ(result.timings.size(), 6u);
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
