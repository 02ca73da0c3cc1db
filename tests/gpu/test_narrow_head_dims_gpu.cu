// Head dims the sm90 kernels are not instantiated for (multiples of 16 below
// 128: 32, 48, 80, 96 here; odd multiples of 8: 24, 40, 72, 120; above 128:
// 136 … 240) through the public entry points: recipe fp8's forward reads them
// as they are, its tensor maps filling the missing channels with zeros (those
// above 128 on its 256-wide kernel; the odd multiples of 8 from code rows at a
// 16-byte pitch); everything else below 128 runs on the D = 64 and 128 kernels
// with zero channels appended (src/dispatch/head_dim_padding.hpp). The result
// must be the emulator's for the unpadded problem (the CPU tests show padding changes no
// emulator bit), and bit for bit what the explicitly padded call gives, so
// that the softmax scale of the unpadded D is the one applied.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "dispatch/head_dim_padding.hpp"
#include "fp4attn/attention.hpp"
#include "fp4attn/emulator.hpp"
#include "fp4attn/error.hpp"
#include "fp4attn/metrics.hpp"
#include "gpu/forward_check.hpp"
#include "gpu/gpu_test_util.hpp"

namespace fp4attn {
namespace {

constexpr double kGradMaxRelL2VsEmulator = 1e-2;  // test_bwd_gpu.cu's bound for both recipes
constexpr double kGradMinCosineVsEmulator = 1.0 - 2e-5;

struct Inputs {
  std::vector<float> q, k, v;
};

Inputs random_inputs(const AttentionShape& s, std::mt19937& rng) {
  return {gpu_test::attention_input(s.q_elems(), s.D, 0.5f, rng), gpu_test::attention_input(s.kv_elems(), s.D, 3.0f, rng),
          gpu_test::attention_input(s.kv_elems(), s.D, 1.0f, rng)};
}

std::vector<float> pad(const std::vector<float>& x, std::int64_t d, std::int64_t d_to) {
  return append_zero_channels(x, d, d_to);
}

// The call at d must give, bit for bit, what the call with zero channels
// appended up to d_run gives at the softmax scale of d (O's first d columns
// and the LSE).
void expect_the_padded_calls_bits(const ForwardOutput& got, const AttentionShape& s, const Inputs& x,
                                  const AttentionOptions& opt, std::int64_t d_run, const std::string& where) {
  const std::int64_t d = s.D;
  AttentionOptions scaled = opt;
  scaled.softmax_scale = 1.0f / std::sqrt(static_cast<float>(d));
  const ForwardOutput padded = forward(dispatch::with_head_dim(s, d_run), pad(x.q, d, d_run), pad(x.k, d, d_run),
                                       pad(x.v, d, d_run), scaled, Executor::sm90);
  EXPECT_EQ(got.o, first_channels(padded.o, d_run, d)) << where;
  EXPECT_EQ(got.lse, padded.lse) << where;
}

TEST(GpuNarrowHeadDims, ForwardMatchesEmulatorAndThePaddedCall) {
  FP4ATTN_REQUIRE_HOPPER();
  for (const auto& [d, d_run] :
       {std::pair<std::int64_t, std::int64_t>{96, 128}, {32, 64}, {80, 128}, {48, 64}, {40, 64}, {72, 128}, {24, 64},
        {120, 128}})
    for (Recipe recipe : {Recipe::fp8, Recipe::mxfp4_train, Recipe::mxfp4, Recipe::nvfp4}) {
      const AttentionShape s{1, 4, 2, 190, 260, d};
      const std::uint32_t seed = gpu_test::fresh_seed();
      std::mt19937 rng(seed);
      const Inputs x = random_inputs(s, rng);
      AttentionOptions opt;
      opt.recipe = recipe;
      opt.mask = MaskKind::causal;
      const std::string where = "D " + std::to_string(d) + " " + std::string(to_string(recipe)) + " seed " +
                                std::to_string(seed);
      const ForwardOutput got = forward(s, x.q, x.k, x.v, opt, Executor::sm90);
      ASSERT_EQ(got.executor, Executor::sm90) << where;
      ASSERT_EQ(got.o.size(), static_cast<std::size_t>(s.q_elems())) << where;
      const emulator::ForwardResult want = emulator::forward(s, x.q, x.k, x.v, opt);
      if (recipe == Recipe::nvfp4) {
        // BF16 tensor-core sums are not modelled (test_fwd_nvfp4_gpu.cu): the bounds, not the bits.
        EXPECT_LE(compare(got.o, want.o).rel_l2, gpu_test::kForwardMaxRelL2) << where;
        double max_lse = 0.0;
        for (std::size_t i = 0; i < got.lse.size(); ++i)
          if (std::isfinite(want.lse[i])) max_lse = std::max(max_lse, std::fabs(double{got.lse[i]} - want.lse[i]));
        EXPECT_LE(max_lse, gpu_test::kForwardMaxLseDiff) << where;
      } else {
        gpu_test::expect_forward_matches_emulator(got.o, got.lse, want, "padded", where);
      }
      expect_the_padded_calls_bits(got, s, x, opt, d_run, where);
    }
}

// Recipe fp8's forward above 128: on the 256-wide kernel, whose two CTAs per
// query block each store half of O's columns (and the first the LSE).
TEST(GpuNarrowHeadDims, Fp8ForwardAbove128MatchesEmulatorAndThePaddedCall) {
  FP4ATTN_REQUIRE_HOPPER();
  for (std::int64_t d : {160, 192, 240, 136, 200})
    for (MaskKind mask : {MaskKind::causal, MaskKind::none}) {
      constexpr std::int64_t kWide = kSm90Fp8ForwardMaxHeadDim;
      const AttentionShape s{2, 4, 2, 190, 260, d};
      const std::uint32_t seed = gpu_test::fresh_seed();
      std::mt19937 rng(seed);
      const Inputs x = random_inputs(s, rng);
      AttentionOptions opt;
      opt.mask = mask;
      const std::string where = "D " + std::to_string(d) + (mask == MaskKind::none ? " noncausal" : " causal") +
                                " seed " + std::to_string(seed);
      const ForwardOutput got = forward(s, x.q, x.k, x.v, opt, Executor::sm90);
      ASSERT_EQ(got.executor, Executor::sm90) << where;
      gpu_test::expect_forward_matches_emulator(got.o, got.lse, emulator::forward(s, x.q, x.k, x.v, opt), "above 128",
                                                where);
      expect_the_padded_calls_bits(got, s, x, opt, kWide, where);
    }
}

TEST(GpuNarrowHeadDims, BackwardMatchesEmulatorAndThePaddedCall) {
  FP4ATTN_REQUIRE_HOPPER();
  for (const auto& [d, d_run] : {std::pair<std::int64_t, std::int64_t>{96, 128}, {32, 64}, {80, 128}, {72, 128}})
    for (Recipe recipe : {Recipe::fp8, Recipe::mxfp4_train}) {
      const AttentionShape s{1, 4, 2, 190, 260, d};
      const std::uint32_t seed = gpu_test::fresh_seed();
      std::mt19937 rng(seed);
      const Inputs x = random_inputs(s, rng);
      const std::vector<float> d_o = gpu_test::attention_input(s.q_elems(), s.D, 0.1f, rng);
      AttentionOptions opt;
      opt.recipe = recipe;
      opt.mask = MaskKind::causal;
      const std::string where = "D " + std::to_string(d) + " " + std::string(to_string(recipe)) + " seed " +
                                std::to_string(seed);
      const emulator::ForwardResult fwd = emulator::forward(s, x.q, x.k, x.v, opt);
      const BackwardOutput got = backward(s, x.q, x.k, x.v, fwd.o, fwd.lse, d_o, opt, Executor::sm90);
      ASSERT_EQ(got.executor, Executor::sm90) << where;
      const emulator::BackwardResult want = emulator::backward(s, x.q, x.k, x.v, fwd.o, fwd.lse, d_o, opt);
      const std::vector<float>* gpu[] = {&got.dq, &got.dk, &got.dv};
      const std::vector<float>* emu[] = {&want.dq, &want.dk, &want.dv};
      for (int g = 0; g < 3; ++g) {
        ASSERT_EQ(gpu[g]->size(), emu[g]->size()) << where;
        const ErrorMetrics m = compare(*gpu[g], *emu[g]);
        EXPECT_LE(m.rel_l2, kGradMaxRelL2VsEmulator) << "gradient " << g << " " << where;
        EXPECT_GE(m.cosine, kGradMinCosineVsEmulator) << "gradient " << g << " " << where;
      }
      AttentionOptions scaled = opt;
      scaled.softmax_scale = 1.0f / std::sqrt(static_cast<float>(d));
      const BackwardOutput padded =
          backward(dispatch::with_head_dim(s, d_run), pad(x.q, d, d_run), pad(x.k, d, d_run), pad(x.v, d, d_run),
                   pad(fwd.o, d, d_run), fwd.lse, pad(d_o, d, d_run), scaled, Executor::sm90);
      EXPECT_EQ(got.dq, first_channels(padded.dq, d_run, d)) << where;
      EXPECT_EQ(got.dk, first_channels(padded.dk, d_run, d)) << where;
      EXPECT_EQ(got.dv, first_channels(padded.dv, d_run, d)) << where;
    }
}

// The MX recipes above 128: folded into E4M3 for the 256-wide kernel, their
// narrower head dims with zero channels appended to copies.
TEST(GpuNarrowHeadDims, MxRecipesAbove128MatchEmulatorAndThePaddedCall) {
  FP4ATTN_REQUIRE_HOPPER();
  for (const auto& [d, recipe] : {std::pair<std::int64_t, Recipe>{256, Recipe::mxfp4}, {192, Recipe::mxfp4},
                                  {160, Recipe::mxfp4}, {256, Recipe::mxfp4_train}, {208, Recipe::mxfp4_train}}) {
    constexpr std::int64_t kWide = kSm90Fp8ForwardMaxHeadDim;
    const AttentionShape s{2, 4, 2, 190, 260, d};
    const std::uint32_t seed = gpu_test::fresh_seed();
    std::mt19937 rng(seed);
    const Inputs x = random_inputs(s, rng);
    AttentionOptions opt;
    opt.recipe = recipe;
    opt.mask = d == 192 ? MaskKind::none : MaskKind::causal;
    const std::string where =
        "D " + std::to_string(d) + " " + std::string(to_string(recipe)) + " seed " + std::to_string(seed);
    const ForwardOutput got = forward(s, x.q, x.k, x.v, opt, Executor::sm90);
    ASSERT_EQ(got.executor, Executor::sm90) << where;
    gpu_test::expect_forward_matches_emulator(got.o, got.lse, emulator::forward(s, x.q, x.k, x.v, opt), "mxfp4 wide",
                                              where);
    if (d != kWide) expect_the_padded_calls_bits(got, s, x, opt, kWide, where);
  }
}

// Above 128 only the FP8 kernel's forward exists: for recipe nvfp4 the sm90
// executor names D and automatic runs the emulator.
TEST(GpuNarrowHeadDims, OtherRecipesAbove128StayOnTheEmulator) {
  FP4ATTN_REQUIRE_HOPPER();
  const AttentionShape s{1, 2, 2, 64, 64, 160};
  std::mt19937 rng(gpu_test::fresh_seed());
  const Inputs x = random_inputs(s, rng);
  for (Recipe recipe : {Recipe::nvfp4}) {
    AttentionOptions opt;
    opt.recipe = recipe;
    try {
      forward(s, x.q, x.k, x.v, opt, Executor::sm90);
      FAIL() << to_string(recipe) << " at D = 160 ran on the sm90 executor";
    } catch (const Error& e) {
      EXPECT_EQ(e.argument(), "D") << to_string(recipe);
    }
    EXPECT_EQ(forward(s, x.q, x.k, x.v, opt).executor, Executor::emulator) << to_string(recipe);
  }
  EXPECT_EQ(forward(s, x.q, x.k, x.v, {}).executor, Executor::sm90);  // recipe fp8
}

}  // namespace
}  // namespace fp4attn
