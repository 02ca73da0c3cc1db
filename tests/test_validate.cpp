// Argument validation and executor choice in dispatch: every rule rejects bad
// input with an fp4attn::Error naming the argument, and forward() runs only
// on input that passed.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>

#include "dispatch/head_dim_padding.hpp"
#include "dispatch/sm90_executor.hpp"
#include "fp4attn/attention.hpp"
#include "fp4attn/error.hpp"

namespace fp4attn {
namespace {

constexpr AttentionShape kShape{.B = 1, .Hq = 4, .Hkv = 2, .Sq = 48, .Sk = 80, .D = 64};

// The argument named by the Error that `f` throws, with its message; fails
// the test when nothing (or something else) is thrown.
template <typename F>
std::pair<std::string, std::string> error_of(const F& f) {
  try {
    f();
  } catch (const Error& e) {
    return {e.argument(), e.what()};
  }
  ADD_FAILURE() << "no fp4attn::Error thrown";
  return {};
}

std::string argument_of_shape(const AttentionShape& s, const AttentionOptions& opt = {}) {
  return error_of([&] { validate(s, opt); }).first;
}

std::vector<float> random_tensor(std::int64_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> x(static_cast<std::size_t>(n));
  for (float& e : x) e = dist(rng);
  return x;
}

TEST(Validate, AcceptsGoodProblems) {
  EXPECT_NO_THROW(validate(kShape, {}));
  for (std::int64_t d : {16, 32, 48, 64, 80, 96, 112, 128, 160, 256}) {
    AttentionShape s = kShape;
    s.D = d;
    EXPECT_NO_THROW(validate(s, {})) << "D=" << d;
  }
  AttentionOptions opt;
  opt.block_q = 32;
  opt.block_k = 256;
  opt.softmax_scale = 0.0f;  // means 1/sqrt(D)
  EXPECT_NO_THROW(validate(kShape, opt));
}

TEST(Validate, EverySizeMustBePositive) {
  const std::pair<std::int64_t AttentionShape::*, const char*> fields[] = {
      {&AttentionShape::B, "B"},   {&AttentionShape::Hq, "Hq"}, {&AttentionShape::Hkv, "Hkv"},
      {&AttentionShape::Sq, "Sq"}, {&AttentionShape::Sk, "Sk"}, {&AttentionShape::D, "D"}};
  for (const auto& [field, name] : fields) {
    for (std::int64_t bad : {0, -1}) {
      AttentionShape s = kShape;
      s.*field = bad;
      EXPECT_EQ(argument_of_shape(s), name) << name << "=" << bad;
    }
  }
}

TEST(Validate, QueryHeadsMustBeAMultipleOfKeyHeads) {
  AttentionShape s = kShape;
  s.Hq = 12;
  s.Hkv = 5;
  const auto [arg, msg] = error_of([&] { validate(s, {}); });
  EXPECT_EQ(arg, "Hq");
  EXPECT_EQ(msg, "Hq: Hq (12) must be a multiple of Hkv (5)");
  s.Hkv = 1;  // MQA is fine
  EXPECT_NO_THROW(validate(s, {}));
}

TEST(Validate, HeadDimMustBeAMultipleOf8UpTo256) {
  for (std::int64_t d : {8, 40, 72, 200, 256}) {
    AttentionShape s = kShape;
    s.D = d;
    EXPECT_NO_THROW(validate(s, {})) << d;
  }
  for (std::int64_t d : {4, 12, 36, 100, 260, 264, 272, 288, 512}) {
    AttentionShape s = kShape;
    s.D = d;
    const auto [arg, msg] = error_of([&] { validate(s, {}); });
    EXPECT_EQ(arg, "D");
    EXPECT_NE(msg.find("D=" + std::to_string(d) + " is not supported"), std::string::npos) << msg;
  }
}

TEST(Validate, SizesThatOverflowAreRejected) {
  constexpr std::int64_t kHuge = std::int64_t{1} << 40;
  AttentionShape s = kShape;
  s.Sq = kHuge;
  s.Sk = kHuge;
  EXPECT_FALSE(argument_of_shape(s).empty());
  s = kShape;
  s.B = kHuge;
  s.Hq = kHuge / 2;
  s.Hkv = kHuge / 2;
  EXPECT_FALSE(argument_of_shape(s).empty());
}

TEST(Validate, TileSizes) {
  for (int bad : {0, 16, 48, 288, -32}) {
    AttentionOptions opt;
    opt.block_q = bad;
    EXPECT_EQ(argument_of_shape(kShape, opt), "block_q") << bad;
    opt = {};
    opt.block_k = bad;
    EXPECT_EQ(argument_of_shape(kShape, opt), "block_k") << bad;
  }
}

TEST(Validate, SoftmaxScaleAndThreads) {
  for (float bad : {-1.0f, std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    AttentionOptions opt;
    opt.softmax_scale = bad;
    EXPECT_EQ(argument_of_shape(kShape, opt), "softmax_scale") << bad;
  }
  AttentionOptions opt;
  opt.threads = -1;
  EXPECT_EQ(argument_of_shape(kShape, opt), "threads");
}

// A sliding window's bounds: -1 (none) or >= 0, and with a causal mask the
// right one -1 or 0 (the mask ends each row at its diagonal already).
TEST(Validate, WindowBounds) {
  for (MaskKind mask : {MaskKind::none, MaskKind::causal, MaskKind::causal_top_left})
    for (Window ok : {Window{-1, -1}, Window{0, -1}, Window{5, 0}, Window{-1, 0}, Window{1 << 20, -1}}) {
      AttentionOptions opt;
      opt.mask = mask, opt.window = ok;
      EXPECT_NO_THROW(validate(kShape, opt)) << ok.left << "," << ok.right;
    }
  AttentionOptions opt;
  opt.window = {-2, 3};
  EXPECT_EQ(argument_of_shape(kShape, opt), "window_left");
  opt.window = {3, -7};
  EXPECT_EQ(argument_of_shape(kShape, opt), "window_right");
  opt.window = {3, 7};  // both sides without a causal mask
  EXPECT_NO_THROW(validate(kShape, opt));
  for (MaskKind causal : {MaskKind::causal, MaskKind::causal_top_left}) {
    opt.mask = causal;
    const auto [argument, message] = error_of([&] { validate(kShape, opt); });
    EXPECT_EQ(argument, "window_right");
    EXPECT_NE(message.find("causal"), std::string::npos) << message;
  }
}

// nvfp4's BF16 kernel takes no window: such calls run on the emulator.
TEST(Dispatch, Sm90RunsWindowsOnEveryRecipe) {
  AttentionOptions opt;
  for (Window w : {Window{64, 0}, Window{-1, 5}, Window{0, -1}}) {
    opt.window = w;
    opt.mask = w.right == 0 ? MaskKind::causal : MaskKind::none;
    for (Recipe r : {Recipe::fp8, Recipe::mxfp4, Recipe::mxfp4_train, Recipe::nvfp4}) {
      opt.recipe = r;
      EXPECT_TRUE(sm90_supports(kShape, opt)) << to_string(r) << " window " << w.left << " " << w.right;
    }
  }
}

TEST(Validate, ElementCounts) {
  const std::size_t q = kShape.q_elems(), kv = kShape.kv_elems();
  EXPECT_NO_THROW(validate_sizes(kShape, q, kv, kv));
  EXPECT_EQ(error_of([&] { validate_sizes(kShape, q - 1, kv, kv); }).first, "q");
  EXPECT_EQ(error_of([&] { validate_sizes(kShape, q, kv + 1, kv); }).first, "k");
  EXPECT_EQ(error_of([&] { validate_sizes(kShape, q, kv, 0); }).first, "v");
}

TEST(Dispatch, Sm90SupportsItsHeadDimsTileAndTarget) {
  AttentionShape s = kShape;
  AttentionOptions opt;
  for (int d : kSm90HeadDims) {
    s.D = d;
    EXPECT_TRUE(sm90_supports(s, opt)) << d;
  }
  s.D = 32;  // recipe fp8 reads it as it is (zero channels by TMA); the others get it padded by forward
  EXPECT_TRUE(sm90_supports(s, opt));
  EXPECT_FALSE(sm90_kernel_head_dim(32));
  opt.recipe = Recipe::mxfp4;
  EXPECT_FALSE(sm90_supports(s, opt));
  opt = {};
  s.D = 96;  // read as it is by recipe fp8 too
  EXPECT_TRUE(sm90_supports(s, opt));
  for (int d : {16, 24, 40, 72, 120, 136, 200}) {  // and every multiple of 8 from 16 (its codes at a 16-byte pitch)
    s.D = d;
    EXPECT_TRUE(sm90_supports(s, opt)) << d;
  }
  s.D = 8;  // narrower than the FP8 quantizer's lanes: padded by forward
  EXPECT_FALSE(sm90_supports(s, opt));
  s.D = 72;  // the other recipes run it padded to 128
  for (Recipe r : {Recipe::mxfp4, Recipe::mxfp4_train, Recipe::nvfp4}) {
    opt.recipe = r;
    EXPECT_FALSE(sm90_supports(s, opt)) << to_string(r);
  }
  opt = {};
  for (int d : {144, 160, 192, 240, 256}) {  // recipe fp8's forward on the 256-wide kernel
    s.D = d;
    EXPECT_TRUE(sm90_supports(s, opt)) << d;
    EXPECT_FALSE(sm90_kernel_head_dim(d)) << d;  // no backward, no other recipe there
  }
  s.D = 160;  // padded to 256 for the MX recipes (by forward); no kernel for nvfp4
  for (Recipe r : {Recipe::mxfp4, Recipe::mxfp4_train, Recipe::nvfp4}) {
    opt.recipe = r;
    EXPECT_FALSE(sm90_supports(s, opt)) << to_string(r);
  }
  s.D = 256;  // the MX recipes fold into E4M3 for the same kernel; nvfp4 has none there
  opt.recipe = Recipe::nvfp4;
  EXPECT_FALSE(sm90_supports(s, opt));
  for (Recipe r : {Recipe::mxfp4, Recipe::mxfp4_train}) {
    opt.recipe = r;
    EXPECT_TRUE(sm90_supports(s, opt)) << to_string(r);
  }
  opt = {};
  EXPECT_EQ(dispatch::sm90_head_dim_for(32), 64);
  EXPECT_EQ(dispatch::sm90_head_dim_for(64), 64);
  EXPECT_EQ(dispatch::sm90_head_dim_for(96), 128);
  EXPECT_EQ(dispatch::sm90_head_dim_for(128), 128);
  EXPECT_EQ(dispatch::sm90_head_dim_for(160), 256);
  EXPECT_EQ(dispatch::sm90_head_dim_for(256), 256);
  EXPECT_EQ(dispatch::sm90_head_dim_for(272), 0);
  s.D = 64;
  opt.target = Target::sm100;
  EXPECT_FALSE(sm90_supports(s, opt));
  opt = {};
  opt.block_k = 64;  // the kernel's tile is fixed
  EXPECT_FALSE(sm90_supports(s, opt));
  opt = {};
  // The MX recipes fold into E4M3 for the same kernel; NVFP4 runs on BF16
  // wgmma. Every recipe has both P paths (Direct-P and the exp2 baseline).
  for (Recipe r : {Recipe::fp8, Recipe::mxfp4, Recipe::mxfp4_train, Recipe::nvfp4})
    for (bool direct_p : {true, false}) {
      opt.recipe = r;
      opt.direct_p = direct_p;
      EXPECT_TRUE(sm90_supports(s, opt)) << to_string(r) << " direct_p " << direct_p;
    }
}

// The kernels' grids hold the batch and the query heads in dimensions CUDA
// caps at 65535: one sm90 call past that is refused naming the argument, also
// by the device entry points before anything is launched.
TEST(Dispatch, Sm90CallsHoldAtMost65535BatchEntriesAndHeads) {
  AttentionShape s = kShape;
  s.B = dispatch::kSm90MaxBatch;
  dispatch::check_sm90_grid(s);  // no throw
  s.B = dispatch::kSm90MaxBatch + 1;
  const auto [arg, what] = error_of([&] { dispatch::check_sm90_grid(s); });
  EXPECT_EQ(arg, "B");
  EXPECT_NE(what.find("65536"), std::string::npos) << what;
  if (cuda_built()) {
    dispatch::DeviceForwardArgs f;
    f.shape = s;
    EXPECT_EQ(error_of([&] { dispatch::sm90_forward_device(f, {}, nullptr); }).first, "B");
    dispatch::DeviceBackwardArgs b;
    b.shape = s;
    EXPECT_EQ(error_of([&] { dispatch::sm90_backward_device(b, {}, true, nullptr); }).first, "B");
  }
  s = kShape;
  s.Hq = s.Hkv = dispatch::kSm90MaxBatch + 1;
  EXPECT_EQ(error_of([&] { dispatch::check_sm90_grid(s); }).first, "Hq");
}

TEST(Dispatch, DescribesTheDevice) {
  const std::string d = device_description();
  if (!sm90_available()) {
    EXPECT_NE(d.find("running the CPU emulator"), std::string::npos) << d;
  }
  if (!cuda_built()) {
    EXPECT_FALSE(sm90_available());
  }
}

class Forward : public ::testing::Test {
 protected:
  std::vector<float> q = random_tensor(kShape.q_elems(), 1);
  std::vector<float> k = random_tensor(kShape.kv_elems(), 2);
  std::vector<float> v = random_tensor(kShape.kv_elems(), 3);
};

TEST_F(Forward, AutomaticRunsAndFillsTheOutput) {
  const ForwardOutput out = forward(kShape, q, k, v, {});
  EXPECT_EQ(out.executor, sm90_available() ? Executor::sm90 : Executor::emulator);
  ASSERT_EQ(out.o.size(), static_cast<std::size_t>(kShape.q_elems()));
  ASSERT_EQ(out.lse.size(), static_cast<std::size_t>(kShape.lse_elems()));
  double sum_abs = 0.0;
  for (float x : out.o) {
    ASSERT_TRUE(std::isfinite(x));
    sum_abs += std::fabs(x);
  }
  EXPECT_GT(sum_abs, 0.0);
  for (float x : out.lse) ASSERT_TRUE(std::isfinite(x));
}

TEST_F(Forward, ValidatesFirst) {
  AttentionShape s = kShape;
  s.D = 100;
  EXPECT_EQ(error_of([&] { forward(s, q, k, v, {}); }).first, "D");
  EXPECT_EQ(error_of([&] { forward(kShape, std::span(q).first(q.size() - 1), k, v, {}); }).first, "q");
  EXPECT_EQ(error_of([&] { forward(kShape, q, std::span(k).first(k.size() - 1), v, {}); }).first, "k");
  EXPECT_EQ(error_of([&] { forward(kShape, q, k, std::span(v).first(v.size() - 1), {}); }).first, "v");
}

TEST_F(Forward, NonFiniteInputIsNamed) {
  for (bool smooth_k : {true, false}) {
    AttentionOptions opt;
    opt.smooth_k = smooth_k;
    const float kBad[] = {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()};
    for (float bad : kBad) {
      for (auto [tensor, name] : {std::pair{&q, "q"}, {&k, "k"}, {&v, "v"}}) {
        const float saved = (*tensor)[7];
        (*tensor)[7] = bad;
        EXPECT_EQ(error_of([&] { forward(kShape, q, k, v, opt); }).first, name) << name << " smooth_k " << smooth_k;
        (*tensor)[7] = saved;
      }
    }
  }
}

TEST_F(Forward, Sm90ExecutorRefusesWhatItCannotRun) {
  AttentionShape s = kShape;
  s.D = 160;  // the emulator takes it; above 128 the sm90 executor has no nvfp4 kernel
  std::vector<float> q160 = random_tensor(s.q_elems(), 4), kv160 = random_tensor(s.kv_elems(), 5);
  AttentionOptions nvfp4;
  nvfp4.recipe = Recipe::nvfp4;
  EXPECT_EQ(error_of([&] { forward(s, q160, kv160, kv160, nvfp4, Executor::sm90); }).first, "D");
  if (!sm90_available()) {  // recipe fp8 passes the head-dim check and needs the GPU
    EXPECT_EQ(error_of([&] { forward(s, q160, kv160, kv160, {}, Executor::sm90); }).first, "executor");
  }
  AttentionOptions sm100;
  sm100.target = Target::sm100;
  EXPECT_EQ(error_of([&] { forward(kShape, q, k, v, sm100, Executor::sm90); }).first, "executor");
  if (!sm90_available()) {
    EXPECT_EQ(error_of([&] { forward(kShape, q, k, v, {}, Executor::sm90); }).first, "executor");
  }
}

TEST_F(Forward, EmulatorOnRequest) {
  EXPECT_EQ(forward(kShape, q, k, v, {}, Executor::emulator).executor, Executor::emulator);
}

}  // namespace
}  // namespace fp4attn
