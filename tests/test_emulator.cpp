// The CPU emulator's forward pass: known answers first, then every recipe ×
// Direct-P × smooth_k × target × mask against the fp64 reference (kernel
// error on the same quantized operands, recipe error on the original
// inputs), then the cases users hit: fully masked rows, GQA, top-left
// causal, the sm90 exactness window, the smooth_k LSE correction, threads,
// and bad input.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <utility>
#include <vector>

#include "emulator_bounds.hpp"
#include "dispatch/head_dim_padding.hpp"
#include "emulator_fixtures.hpp"
#include "fp4attn/direct_p.hpp"
#include "fp4attn/error.hpp"

namespace fp4attn::emulator {
namespace {

using testing::Errors;
using testing::Inputs;
using testing::OBounds;

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
// Seeds the bounds were calibrated on are 1..kCalibrationSeeds; the tests draw
// fresh data from seeds above them.
constexpr std::uint64_t kCalibrationSeeds = 8;
constexpr std::uint64_t kTestSeed = 1001;
// log2(Sk) in fp32, then · ln 2: a few ulps of ln Sk.
constexpr double kLseRoundoff = 1e-5;

AttentionOptions with(AttentionOptions o, const testing::SweepProblem& p, MaskKind mask) {
  o.block_q = p.block_q, o.block_k = p.block_k, o.mask = mask;
  return o;
}

void expect_within(const ErrorMetrics& m, const OBounds& b, bool lse, const std::string& what) {
  EXPECT_EQ(m.nonfinite_mismatch, 0) << what;
  if (lse) {
    EXPECT_LE(m.max_abs, b.lse_max_abs) << what << " LSE max abs";
    return;
  }
  EXPECT_LE(m.rel_l2, b.rel_l2) << what << " rel L2";
  EXPECT_LE(m.rel_l1, b.rel_l1) << what << " rel L1";
  EXPECT_LE(1.0 - m.cosine, b.one_minus_cos) << what << " 1 - cosine";
  EXPECT_LE(m.max_abs, b.max_abs) << what << " max abs";
}

// Runs o on x and holds O and the LSE to o's bounds against both references.
void expect_measure_within(const AttentionShape& shape, const Inputs& x, const AttentionOptions& o,
                           const std::string& what) {
  const testing::Bounds& b = testing::bounds_for(o);
  const Errors e = testing::measure(shape, x, o);
  expect_within(e.kernel_o, b.kernel, false, what + " kernel O");
  expect_within(e.kernel_lse, b.kernel, true, what + " kernel");
  expect_within(e.recipe_o, b.recipe_error, false, what + " recipe O");
  expect_within(e.recipe_lse, b.recipe_error, true, what + " recipe");
}

// ---- the metrics every comparison uses ----------------------------------------------

TEST(ErrorMetrics, NonFinitePositionsAndNorms) {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> got{1.0f, 2.0f, -inf, nan, 3.0f, inf};
  const std::vector<double> ref{1.0, 2.5, -inf, 1.0, -4.0, -inf};
  const ErrorMetrics m = compare(got, ref);
  EXPECT_EQ(m.nonfinite_mismatch, 2);  // NaN vs 1, +inf vs -inf; -inf vs -inf matches
  // Finite positions: got (1, 2, 3), ref (1, 2.5, -4).
  EXPECT_DOUBLE_EQ(m.max_abs, 7.0);
  EXPECT_DOUBLE_EQ(m.rel_l1, 7.5 / 7.5);
  EXPECT_NEAR(m.rel_l2, std::sqrt(0.25 + 49.0) / std::sqrt(1 + 6.25 + 16), 1e-12);
  EXPECT_NEAR(m.cosine, (1 + 5 - 12) / std::sqrt(14.0 * 23.25), 1e-12);
  const std::vector<float> a{1.0f, -2.0f}, twice{2.0f, -4.0f};
  EXPECT_NEAR(compare(twice, a).cosine, 1.0, 1e-12);
  EXPECT_THROW(compare(a, std::vector<float>{1.0f}), Error);
}

// ---- known answers ---------------------------------------------------------------

// Q = K = 0 makes every score 0, so every visible key gets the same P and
// O = mean of V = 1 exactly in every format, and LSE = ln Sk.
TEST(EmulatorForward, KnownAnswerUniformScores) {
  const AttentionShape s{.B = 1, .Hq = 2, .Hkv = 1, .Sq = 77, .Sk = 300, .D = 64};
  const std::vector<float> zeros(s.q_elems(), 0.0f), ones(s.kv_elems(), 1.0f), kzeros(s.kv_elems(), 0.0f);
  for (AttentionOptions o : testing::sweep_configs()) {
    o.block_q = 32, o.block_k = 64;
    const ForwardResult r = forward(s, zeros, kzeros, ones, o);
    for (float x : r.o) ASSERT_EQ(x, 1.0f) << testing::describe(o);
    // NVFP4 P stands for the row maximum 256 by q·s_b with s_b an E4M3 value
    // (3 mantissa bits): within 1/16 of it, and l counts the value used.
    const double tol = o.recipe == Recipe::nvfp4 ? std::log1p(1.0 / 16) : kLseRoundoff;
    for (float x : r.lse) ASSERT_NEAR(x, std::log(300.0), tol) << testing::describe(o);
  }
}

// ---- every configuration against the fp64 reference ------------------------------

TEST(EmulatorForward, AllRecipesAgainstReference) {
  for (const testing::SweepProblem& p : testing::sweep_problems()) {
    const Inputs x = testing::realistic_inputs(p.shape, kTestSeed);
    for (const AttentionOptions& base : testing::sweep_configs())
      for (MaskKind mask : {MaskKind::none, MaskKind::causal}) {
        const AttentionOptions o = with(base, p, mask);
        expect_measure_within(p.shape, x, o, testing::describe(o) + " D=" + std::to_string(p.shape.D));
      }
  }
}

// ---- masks and heads --------------------------------------------------------------

// Bottom-right causal with Sq > Sk: the first Sq − Sk query rows see no key.
TEST(EmulatorForward, FullyMaskedRowsGiveZeroAndMinusInf) {
  const AttentionShape s{.B = 1, .Hq = 1, .Hkv = 1, .Sq = 150, .Sk = 100, .D = 64};
  const Inputs x = testing::realistic_inputs(s, kTestSeed);
  for (Recipe r : kAllRecipes) {
    AttentionOptions o;
    o.recipe = r, o.mask = MaskKind::causal, o.block_q = 64, o.block_k = 64;
    const ForwardResult got = forward(s, x.q, x.k, x.v, o);
    for (std::int64_t i = 0; i < s.Sq; ++i) {
      const bool masked = i < s.Sq - s.Sk;
      EXPECT_EQ(std::isinf(got.lse[i]) && got.lse[i] < 0, masked) << to_string(r) << " row " << i;
      if (!masked) continue;
      for (std::int64_t d = 0; d < s.D; ++d) ASSERT_EQ(got.o[i * s.D + d], 0.0f) << to_string(r) << " row " << i;
    }
    EXPECT_NE(got.o[(s.Sq - s.Sk) * s.D], 0.0f) << "first row with a visible key";
  }
}

// An all-zero query row against an all-zero key tile folds (MXFP4 on sm90) to
// factors of 2^-133 each, whose product underflows to 0: the causally masked
// keys of that tile must stay −inf (the kernels' smallest-subnormal guard, which
// the emulator applies too), and O and LSE finite. Zero padding does this.
TEST(EmulatorForward, ZeroRowsAgainstAZeroKeyTileStayFinite) {
  const AttentionShape s{.B = 1, .Hq = 2, .Hkv = 1, .Sq = 256, .Sk = 256, .D = 64};
  Inputs x = testing::realistic_inputs(s, kTestSeed);
  for (std::int64_t i = 128 * s.Hq * s.D; i < s.q_elems(); ++i) x.q[i] = 0.0f;  // query rows 128..255
  for (std::int64_t i = 128 * s.Hkv * s.D; i < s.kv_elems(); ++i) x.k[i] = 0.0f;  // key tile 1
  for (Recipe r : {Recipe::mxfp4, Recipe::mxfp4_train}) {
    AttentionOptions o;
    o.recipe = r, o.mask = MaskKind::causal, o.smooth_k = false, o.target = Target::sm90;
    const ForwardResult got = forward(s, x.q, x.k, x.v, o);
    std::size_t nonfinite = 0;
    for (float e : got.o) nonfinite += !std::isfinite(e);
    for (float e : got.lse) nonfinite += !std::isfinite(e);
    EXPECT_EQ(nonfinite, 0u) << to_string(r);
    // Row 200 (zero) sees keys 0..200; its scores against key tile 1 are all 0.
    const double lse = got.lse[200];  // head 0, (B, Hq, Sq) layout
    EXPECT_GT(lse, std::log(201.0) - 1.0) << to_string(r);
  }
}

TEST(EmulatorForward, TopLeftCausalMatchesReference) {
  const AttentionShape s{.B = 1, .Hq = 2, .Hkv = 2, .Sq = 96, .Sk = 160, .D = 64};
  const Inputs x = testing::realistic_inputs(s, kTestSeed);
  AttentionOptions o;
  o.mask = MaskKind::causal_top_left, o.block_q = 32, o.block_k = 64;
  const Errors e = testing::measure(s, x, o);
  const testing::Bounds& b = testing::bounds_for(o);
  expect_within(e.kernel_o, b.kernel, false, "top-left kernel O");
  expect_within(e.kernel_lse, b.kernel, true, "top-left kernel");
}

// Sliding windows (FlashAttention's window_size): a causal one, and one on
// both sides without a causal mask whose rows start inside a key tile and
// end inside another. Every recipe, within the bounds the masks above meet.
TEST(EmulatorForward, WindowsAgainstReference) {
  struct Case {
    MaskKind mask;
    Window window;
  };
  for (const testing::SweepProblem& p : testing::sweep_problems()) {
    const Inputs x = testing::realistic_inputs(p.shape, kTestSeed);
    for (const Case c : {Case{MaskKind::causal, {70, -1}}, Case{MaskKind::none, {45, 20}}})
      for (Recipe r : kAllRecipes) {
        AttentionOptions o = with(AttentionOptions{}, p, c.mask);
        o.recipe = r, o.window = c.window;
        expect_measure_within(p.shape, x, o,
                              testing::describe(o) + " window " + std::to_string(c.window.left) + "," +
                                  std::to_string(c.window.right) + " D=" + std::to_string(p.shape.D));
      }
  }
}

// Rows whose window lies past the last key (Sq > Sk, top-left causal) see
// nothing: O = 0 and LSE = −inf; the rows before them see their few keys.
TEST(EmulatorForward, WindowPastTheKeysGivesZeroAndMinusInf) {
  const AttentionShape s{.B = 1, .Hq = 1, .Hkv = 1, .Sq = 150, .Sk = 100, .D = 64};
  const Inputs x = testing::realistic_inputs(s, kTestSeed);
  AttentionOptions o;
  o.mask = MaskKind::causal_top_left, o.window = {20, -1}, o.block_q = 64, o.block_k = 64;
  const ForwardResult got = forward(s, x.q, x.k, x.v, o);
  for (std::int64_t i = 0; i < s.Sq; ++i) {
    const bool masked = i - 20 >= s.Sk;  // keys i − 20 .. i
    EXPECT_EQ(std::isinf(got.lse[i]) && got.lse[i] < 0, masked) << " row " << i;
    if (masked) {
      for (std::int64_t d = 0; d < s.D; ++d) ASSERT_EQ(got.o[i * s.D + d], 0.0f) << " row " << i;
    }
  }
}

// A group of query heads reading one kv head gives bit for bit what plain
// multi-head attention gives with that kv head copied to each of them.
TEST(EmulatorForward, GqaEqualsRepeatedKeyValueHeads) {
  const AttentionShape gqa{.B = 2, .Hq = 4, .Hkv = 2, .Sq = 70, .Sk = 90, .D = 64};
  AttentionShape mha = gqa;
  mha.Hkv = gqa.Hq;
  const Inputs x = testing::realistic_inputs(gqa, kTestSeed);
  std::vector<float> k(mha.kv_elems()), v(mha.kv_elems());
  for (std::int64_t b = 0; b < gqa.B; ++b)
    for (std::int64_t s = 0; s < gqa.Sk; ++s)
      for (std::int64_t h = 0; h < mha.Hkv; ++h)
        for (std::int64_t d = 0; d < gqa.D; ++d) {
          const std::int64_t src = bshd_index(gqa.Sk, gqa.Hkv, gqa.D, b, s, h / gqa.group(), d);
          k[bshd_index(mha.Sk, mha.Hkv, mha.D, b, s, h, d)] = x.k[src];
          v[bshd_index(mha.Sk, mha.Hkv, mha.D, b, s, h, d)] = x.v[src];
        }
  for (const AttentionOptions& base : testing::sweep_configs()) {
    AttentionOptions o = base;
    o.mask = MaskKind::causal, o.block_q = 32, o.block_k = 32;
    const ForwardResult a = forward(gqa, x.q, x.k, x.v, o);
    const ForwardResult m = forward(mha, x.q, k, v, o);
    EXPECT_EQ(a.o, m.o) << testing::describe(o);
    EXPECT_EQ(a.lse, m.lse) << testing::describe(o);
  }
}

// Channels of zeros appended to Q, K and V change no bit of O's first D
// columns or of the LSE, in every recipe (block scales and smooth_k's mean see
// zeros; Q·Kᵀ adds exact zeros; V's extra columns are dropped) as long as the
// softmax scale stays that of D. This is what lets a head dim the kernels lack
// (D = 32, 96) run on the next one they have (src/dispatch/head_dim_padding.hpp).
TEST(EmulatorForward, ZeroChannelsChangeNoBit) {
  // 80 and 48 are no multiples of 32: the emulator pads them itself (to 96, 64).
  for (const auto& [d, d_pad] : {std::pair{96, 128}, std::pair{32, 64}, std::pair{80, 128}, std::pair{48, 64},
                                 std::pair{40, 64}, std::pair{72, 128}, std::pair{8, 64}}) {
    const AttentionShape s{.B = 1, .Hq = 2, .Hkv = 1, .Sq = 70, .Sk = 150, .D = d};
    AttentionShape sp = s;
    sp.D = d_pad;
    const Inputs x = testing::realistic_inputs(s, kTestSeed);
    const auto pad = [&](const std::vector<float>& a) { return append_zero_channels(a, d, d_pad); };
    const std::vector<float> qp = pad(x.q), kp = pad(x.k), vp = pad(x.v);
    for (const AttentionOptions& base : testing::sweep_configs()) {
      AttentionOptions o = base;
      o.mask = MaskKind::causal;
      o.softmax_scale = 1.0f / std::sqrt(static_cast<float>(d));
      const ForwardResult a = forward(s, x.q, x.k, x.v, o);
      const ForwardResult p = forward(sp, qp, kp, vp, o);
      std::size_t differ = 0;
      for (std::size_t row = 0; row < a.o.size() / d; ++row)
        for (int c = 0; c < d; ++c) differ += a.o[row * d + c] != p.o[row * d_pad + c];
      EXPECT_EQ(differ, 0u) << "D " << d << " on " << d_pad << " " << testing::describe(o);
      EXPECT_EQ(a.lse, p.lse) << "D " << d << " on " << d_pad << " " << testing::describe(o);
      for (std::size_t row = 0; row < p.o.size() / d_pad; ++row)
        for (int c = d; c < d_pad; ++c) ASSERT_EQ(p.o[row * d_pad + c], 0.0f) << testing::describe(o);
    }
  }
}

// ---- sm90's exactness window (DESIGN §3.4) -----------------------------------------

// One Q row with two 32-channel blocks 20 binades apart. Block 0 meets a part
// of K that is the same for every key (it shifts all scores alike); block 1
// alone tells the keys apart. On sm100 the block-scaled product keeps it; on
// sm90 the fold to E4M3 (window of 14 binades) flushes it to zero, every
// score becomes equal and O collapses to the mean of V.
TEST(EmulatorForward, Sm90FoldLosesBlocksOutsideTheWindow) {
  constexpr int kBinadeGap = 20;
  const AttentionShape s{.B = 1, .Hq = 1, .Hkv = 1, .Sq = 8, .Sk = 64, .D = 64};
  std::mt19937_64 gen(kTestSeed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const float big = std::ldexp(1.0f, kBinadeGap / 2), small = std::ldexp(1.0f, -kBinadeGap / 2);
  std::vector<float> q(s.q_elems()), k(s.kv_elems()), v(s.kv_elems());
  for (std::int64_t i = 0; i < s.Sq; ++i)
    for (std::int64_t d = 0; d < s.D; ++d) q[i * s.D + d] = (d < 32 ? big : small) * normal(gen);
  std::vector<float> shared_part(32);
  for (float& e : shared_part) e = small * normal(gen);
  for (std::int64_t j = 0; j < s.Sk; ++j)
    for (std::int64_t d = 0; d < s.D; ++d) k[j * s.D + d] = d < 32 ? shared_part[d] : big * normal(gen) / 4;
  for (float& e : v) e = normal(gen);

  AttentionOptions o;
  o.recipe = Recipe::mxfp4, o.smooth_k = false, o.block_q = 64, o.block_k = 64, o.softmax_scale = 1.0f;
  o.target = Target::sm100;
  const QuantizedInputs in = quantize_inputs(s, q, k, v, o);
  const std::vector<double> ref = testing::reference_on_quantized(s, in, o).o;
  const ForwardResult sm100 = forward(s, in, o);
  o.target = Target::sm90;
  const ForwardResult sm90 = forward(s, in, o);

  std::vector<double> mean_v(s.q_elems(), 0.0);  // the uniform-attention answer, per row
  const std::vector<float> vq = in.v.dequantize();
  for (std::int64_t i = 0; i < s.Sq; ++i)
    for (std::int64_t d = 0; d < s.D; ++d) {
      for (std::int64_t j = 0; j < s.Sk; ++j) mean_v[i * s.D + d] += vq[j * s.D + d];
      mean_v[i * s.D + d] /= static_cast<double>(s.Sk);
    }
  const OBounds& kernel = testing::bounds_for(o).kernel;
  EXPECT_LE(compare(sm100.o, ref).rel_l2, kernel.rel_l2) << "sm100 keeps the small block";
  EXPECT_GT(compare(sm90.o, ref).rel_l2, 0.5) << "sm90 must lose the small block";
  EXPECT_LE(compare(sm90.o, mean_v).rel_l2, kernel.rel_l2) << "sm90 attends uniformly";
}

// Inside the window the fold is exact: sm90 and sm100 see the same products
// and differ only in fp32 summation order (with fp32 accumulation on both;
// sm90's FP8 wgmma model would add its own, larger difference).
TEST(EmulatorForward, Sm90FoldIsExactInsideTheWindow) {
  for (Recipe r : {Recipe::mxfp4, Recipe::mxfp4_train}) {
    // sm90 shares P's codes between the curve and MUFU ex2 from key
    // kSm90Fp8MufuFirstKey (mxfp4_train's FP8 P) or kSm90Mxfp4MufuFirstKey
    // (mxfp4's FP4 P) of each 128 on (sm100: the curve throughout): the keys
    // stop there, so that only the fold can differ.
    const std::int64_t sk =
        r == Recipe::mxfp4_train ? direct_p::kSm90Fp8MufuFirstKey : direct_p::kSm90Mxfp4MufuFirstKey;
    const AttentionShape s{.B = 1, .Hq = 2, .Hkv = 2, .Sq = 64, .Sk = sk, .D = 128};
    const Inputs x = testing::realistic_inputs(s, kTestSeed);
    AttentionOptions o;
    o.recipe = r, o.block_q = 64, o.block_k = 64;
    o.accumulation = Accumulation::fp32;
    const QuantizedInputs in = quantize_inputs(s, x.q, x.k, x.v, o);
    o.target = Target::sm90;
    const ForwardResult a = forward(s, in, o);
    o.target = Target::sm100;
    const ForwardResult b = forward(s, in, o);
    // bf16 output: a summation-order difference moves O by at most one bf16 ulp (2^-8 relative).
    EXPECT_LE(compare(a.o, b.o).rel_l2, 1e-3) << to_string(r);
    EXPECT_LE(compare(a.lse, b.lse).max_abs, 1e-4) << to_string(r);
  }
}

// ---- smooth_k ------------------------------------------------------------------------

// Subtracting K's mean shifts each score row by scale·q·k̄; the LSE correction
// adds it back, so LSE with and without smooth_k agree to the quantization
// error while the shift itself is large.
TEST(EmulatorForward, SmoothKCorrectionKeepsTheTrueLse) {
  const AttentionShape s{.B = 1, .Hq = 2, .Hkv = 2, .Sq = 100, .Sk = 200, .D = 64};
  const Inputs x = testing::realistic_inputs(s, kTestSeed);
  AttentionOptions o;
  o.block_q = 64, o.block_k = 64;
  o.smooth_k = true;
  const QuantizedInputs in = quantize_inputs(s, x.q, x.k, x.v, o);
  const ForwardResult smooth = forward(s, in, o);
  o.smooth_k = false;
  const ForwardResult raw = forward(s, x.q, x.k, x.v, o);
  double shift = 0;  // mean |scale·q·k̄| over rows: what the correction must restore
  for (std::int64_t h = 0; h < s.Hq; ++h)
    for (std::int64_t i = 0; i < s.Sq; ++i) {
      double dot = 0;
      for (std::int64_t d = 0; d < s.D; ++d) dot += x.q[(i * s.Hq + h) * s.D + d] * in.k_mean[h * s.D + d];
      shift += std::abs(dot) / std::sqrt(static_cast<double>(s.D));
    }
  shift /= static_cast<double>(s.Hq * s.Sq);
  double mean_diff = 0;
  for (std::size_t i = 0; i < smooth.lse.size(); ++i) mean_diff += std::abs(smooth.lse[i] - raw.lse[i]);
  mean_diff /= static_cast<double>(smooth.lse.size());
  EXPECT_GT(shift, 1.0) << "the test needs a K mean that moves the LSE";
  EXPECT_LT(mean_diff, 0.1 * shift) << "without the correction the LSEs would differ by the shift";
  EXPECT_LE(compare(smooth.lse, raw.lse).max_abs, testing::bounds_for(o).recipe_error.lse_max_abs);
}

// ---- execution ------------------------------------------------------------------------

TEST(EmulatorForward, ThreadCountDoesNotChangeResults) {
  const AttentionShape s{.B = 2, .Hq = 2, .Hkv = 1, .Sq = 130, .Sk = 130, .D = 64};
  const Inputs x = testing::realistic_inputs(s, kTestSeed);
  for (Recipe r : kAllRecipes) {
    AttentionOptions o;
    o.recipe = r, o.mask = MaskKind::causal, o.block_q = 32, o.block_k = 64;
    o.threads = 1;
    const ForwardResult one = forward(s, x.q, x.k, x.v, o);
    o.threads = 2;
    const ForwardResult two = forward(s, x.q, x.k, x.v, o);
    EXPECT_EQ(one.o, two.o) << to_string(r);
    EXPECT_EQ(one.lse, two.lse) << to_string(r);
  }
}

TEST(EmulatorForward, RejectsBadInput) {
  const AttentionShape s{.B = 1, .Hq = 2, .Hkv = 1, .Sq = 16, .Sk = 16, .D = 64};
  const Inputs x = testing::realistic_inputs(s, kTestSeed);
  auto expect_error = [&](AttentionShape shape, AttentionOptions o, std::span<const float> q, const char* argument) {
    try {
      forward(shape, q, x.k, x.v, o);
      ADD_FAILURE() << "no error for " << argument;
    } catch (const Error& e) {
      EXPECT_EQ(e.argument(), argument) << e.what();
    }
  };
  AttentionOptions o;
  expect_error(s, o, std::span<const float>(x.q).first(10), "q");
  o.block_k = 48;  // MXFP4 P blocks of 32 would straddle key tiles
  expect_error(s, o, x.q, "block_k");
  o = AttentionOptions{};
  AttentionShape odd = s;
  odd.Hkv = 3;
  expect_error(odd, o, x.q, "Hq");
  std::vector<float> nan_q = x.q;
  nan_q[5] = std::numeric_limits<float>::quiet_NaN();
  expect_error(s, o, nan_q, "q");
}

// ---- calibration (run by hand; see docs/accuracy.md) ------------------------------------

// Prints, for every configuration, the worst error over kCalibrationSeeds
// seeds, both sweep problems and both masks, as a markdown table and as the
// bounds table of tests/emulator_bounds.hpp (twice the worst value).
TEST(EmulatorCalibration, DISABLED_PrintBounds) {
  std::string table = "| recipe | target | Direct-P | smooth_k | kernel rel L2 | kernel 1-cos | kernel max abs | "
                      "kernel LSE | recipe rel L2 | recipe 1-cos | recipe max abs | recipe LSE |\n"
                      "|---|---|---|---|---|---|---|---|---|---|---|---|\n";
  std::string rows;
  for (const AttentionOptions& base : testing::sweep_configs()) {
    OBounds worst_k{0, 0, 0, 0, 0}, worst_r{0, 0, 0, 0, 0};
    auto grow = [](OBounds& w, const ErrorMetrics& o, const ErrorMetrics& lse) {
      w.rel_l2 = std::max(w.rel_l2, o.rel_l2);
      w.rel_l1 = std::max(w.rel_l1, o.rel_l1);
      w.one_minus_cos = std::max(w.one_minus_cos, 1.0 - o.cosine);
      w.max_abs = std::max(w.max_abs, o.max_abs);
      w.lse_max_abs = std::max(w.lse_max_abs, lse.max_abs);
    };
    for (std::uint64_t seed = 1; seed <= kCalibrationSeeds; ++seed)
      for (const testing::SweepProblem& p : testing::sweep_problems()) {
        const Inputs x = testing::realistic_inputs(p.shape, seed);
        for (MaskKind mask : {MaskKind::none, MaskKind::causal}) {
          const Errors e = testing::measure(p.shape, x, with(base, p, mask));
          grow(worst_k, e.kernel_o, e.kernel_lse);
          grow(worst_r, e.recipe_o, e.recipe_lse);
        }
      }
    char line[512];
    std::snprintf(line, sizeof line, "| %s | %s | %s | %s | %.2e | %.2e | %.2e | %.2e | %.2e | %.2e | %.2e | %.2e |\n",
                  std::string(to_string(base.recipe)).c_str(), std::string(to_string(base.target)).c_str(),
                  base.direct_p ? "on" : "off", base.smooth_k ? "on" : "off", worst_k.rel_l2, worst_k.one_minus_cos,
                  worst_k.max_abs, worst_k.lse_max_abs, worst_r.rel_l2, worst_r.one_minus_cos, worst_r.max_abs,
                  worst_r.lse_max_abs);
    table += line;
    auto twice = [](const OBounds& w) {
      char b[256];
      std::snprintf(b, sizeof b, "{%.2e, %.2e, %.2e, %.2e, %.2e}", 2 * w.rel_l2, 2 * w.rel_l1, 2 * w.one_minus_cos,
                    2 * w.max_abs, 2 * w.lse_max_abs);
      return std::string(b);
    };
    rows += "    {Recipe::" + std::string(to_string(base.recipe)) + ", Target::" + std::string(to_string(base.target)) +
            ", " + (base.direct_p ? "true" : "false") + ", " + (base.smooth_k ? "true" : "false") + ", " +
            twice(worst_k) + ", " + twice(worst_r) + "},\n";
  }
  std::printf("%s\n%s", table.c_str(), rows.c_str());
}

}  // namespace
}  // namespace fp4attn::emulator
