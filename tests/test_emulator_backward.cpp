// The emulator's FP8 backward (recipes fp8 and mxfp4_train): gradients
// against the fp64 reference, on the same quantized operands (kernel error)
// and on the original inputs (recipe error); inference-only recipes refuse.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <span>
#include <utility>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "dispatch/head_dim_padding.hpp"
#include "emulator_fixtures.hpp"
#include "fp4attn/error.hpp"

namespace fp4attn::emulator {
namespace {

using testing::Inputs;

constexpr std::uint64_t kCalibrationSeeds = 6;
constexpr std::uint64_t kTestSeed = 2001;

struct GradBounds {
  double rel_l2, one_minus_cos;  // worst over dQ, dK and dV
};
struct BackwardBounds {
  Recipe recipe;
  Target target;
  GradFormat ds_format;
  bool direct_p, smooth_k;
  GradBounds kernel, recipe_error;
};

// Twice the worst value of EmulatorBackwardCalibration.DISABLED_PrintBounds (docs/accuracy.md).
// clang-format off
constexpr BackwardBounds kBackwardBounds[] = {
    {Recipe::fp8, Target::sm90, GradFormat::e4m3, true, true, {1.93e-01, 9.33e-03}, {2.36e-01, 1.39e-02}},
    {Recipe::mxfp4_train, Target::sm90, GradFormat::e4m3, true, true, {2.18e-01, 1.18e-02}, {9.20e-01, 1.94e-01}},
    {Recipe::mxfp4_train, Target::sm100, GradFormat::e4m3, true, true, {2.19e-01, 1.19e-02}, {9.17e-01, 1.95e-01}},
    {Recipe::fp8, Target::sm90, GradFormat::e4m3, true, false, {3.22e-01, 2.58e-02}, {3.96e-01, 3.83e-02}},
    {Recipe::mxfp4_train, Target::sm90, GradFormat::e4m3, true, false, {3.48e-01, 2.99e-02}, {1.19e+00, 3.31e-01}},
    {Recipe::mxfp4_train, Target::sm100, GradFormat::e4m3, true, false, {3.47e-01, 2.97e-02}, {1.19e+00, 3.31e-01}},
    {Recipe::fp8, Target::sm90, GradFormat::e4m3, false, true, {1.92e-01, 9.27e-03}, {2.37e-01, 1.40e-02}},
    {Recipe::mxfp4_train, Target::sm90, GradFormat::e4m3, false, true, {2.14e-01, 1.14e-02}, {9.20e-01, 1.94e-01}},
    {Recipe::mxfp4_train, Target::sm100, GradFormat::e4m3, false, true, {2.12e-01, 1.12e-02}, {9.20e-01, 1.90e-01}},
    {Recipe::fp8, Target::sm90, GradFormat::e4m3, false, false, {3.28e-01, 2.65e-02}, {3.93e-01, 3.78e-02}},
    {Recipe::mxfp4_train, Target::sm90, GradFormat::e4m3, false, false, {3.31e-01, 2.72e-02}, {1.18e+00, 3.28e-01}},
    {Recipe::mxfp4_train, Target::sm100, GradFormat::e4m3, false, false, {3.29e-01, 2.69e-02}, {1.18e+00, 3.28e-01}},
    {Recipe::fp8, Target::sm90, GradFormat::e5m2, true, true, {2.13e-01, 1.14e-02}, {2.61e-01, 1.71e-02}},
};
// clang-format on

AttentionShape backward_shape() { return {.B = 1, .Hq = 2, .Hkv = 1, .Sq = 150, .Sk = 200, .D = 64}; }

std::vector<AttentionOptions> backward_configs() {
  std::vector<AttentionOptions> out;
  auto add = [&](Recipe r, Target t, GradFormat g, bool direct, bool smooth) {
    AttentionOptions o;
    o.recipe = r, o.target = t, o.ds_format = g, o.direct_p = direct, o.smooth_k = smooth;
    o.block_q = 64, o.block_k = 64;
    out.push_back(o);
  };
  for (bool direct : {true, false})
    for (bool smooth : {true, false}) {
      add(Recipe::fp8, Target::sm90, GradFormat::e4m3, direct, smooth);
      add(Recipe::mxfp4_train, Target::sm90, GradFormat::e4m3, direct, smooth);
      add(Recipe::mxfp4_train, Target::sm100, GradFormat::e4m3, direct, smooth);
    }
  add(Recipe::fp8, Target::sm90, GradFormat::e5m2, true, true);
  return out;
}

const BackwardBounds& bounds_for(const AttentionOptions& o) {
  for (const BackwardBounds& b : kBackwardBounds)
    if (b.recipe == o.recipe && b.target == o.target && b.ds_format == o.ds_format && b.direct_p == o.direct_p &&
        b.smooth_k == o.smooth_k)
      return b;
  throw Error("options", "no calibrated backward bounds for " + testing::describe(o));
}

struct Worst {
  GradBounds kernel{0, 0}, recipe_error{0, 0};
};

void grow(GradBounds& w, const ErrorMetrics& m) {
  w.rel_l2 = std::max(w.rel_l2, m.rel_l2);
  w.one_minus_cos = std::max(w.one_minus_cos, 1.0 - m.cosine);
}

// fp64 gradients on the operands the kernel multiplies: dequantized Q and V,
// and dequantized K with the smooth_k mean added back.
reference::BackwardResult reference_on_quantized(const AttentionShape& s, const Inputs& x,
                                                 const std::vector<float>& d_o, const AttentionOptions& o) {
  const QuantizedInputs in = quantize_inputs(s, x.q, x.k, x.v, o);
  std::vector<double> kq = testing::to_double(in.k.dequantize());
  for (std::int64_t i = 0; i < s.kv_elems() && !in.k_mean.empty(); ++i)
    kq[i] += in.k_mean[((i / (s.D * s.Hkv * s.Sk)) * s.Hkv + (i / s.D) % s.Hkv) * s.D + i % s.D];
  return reference::backward(s, testing::to_double(in.q.dequantize()), kq, testing::to_double(in.v.dequantize()),
                             testing::to_double(d_o), o.mask, o.softmax_scale, o.window);
}

// Runs forward + backward and measures dQ, dK, dV against both references.
Worst measure(const AttentionShape& s, std::uint64_t seed, const AttentionOptions& o) {
  const Inputs x = testing::realistic_inputs(s, seed);
  std::mt19937_64 gen(seed + 1);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> d_o(s.q_elems());
  for (float& e : d_o) e = normal(gen);
  const ForwardResult fwd = forward(s, x.q, x.k, x.v, o);
  const BackwardResult got = backward(s, x.q, x.k, x.v, fwd.o, fwd.lse, d_o, o);

  const reference::BackwardResult kref = reference_on_quantized(s, x, d_o, o);
  const reference::BackwardResult rref = reference::backward(
      s, testing::to_double(x.q), testing::to_double(x.k), testing::to_double(x.v), testing::to_double(d_o), o.mask,
      o.softmax_scale, o.window);
  Worst w;
  for (auto [g, k, r] : {std::tuple{&got.dq, &kref.dq, &rref.dq}, std::tuple{&got.dk, &kref.dk, &rref.dk},
                         std::tuple{&got.dv, &kref.dv, &rref.dv}}) {
    const ErrorMetrics mk = compare(*g, *k), mr = compare(*g, *r);
    EXPECT_EQ(mk.nonfinite_mismatch, 0);
    EXPECT_EQ(mr.nonfinite_mismatch, 0);
    grow(w.kernel, mk);
    grow(w.recipe_error, mr);
  }
  return w;
}

TEST(EmulatorBackward, GradientsAgainstReference) {
  for (const AttentionOptions& base : backward_configs())
    for (MaskKind mask : {MaskKind::none, MaskKind::causal}) {
      AttentionOptions o = base;
      o.mask = mask;
      const BackwardBounds& b = bounds_for(o);
      const Worst w = measure(backward_shape(), kTestSeed, o);
      const std::string what = testing::describe(o) + (o.ds_format == GradFormat::e5m2 ? " dS e5m2" : "");
      EXPECT_LE(w.kernel.rel_l2, b.kernel.rel_l2) << what << " kernel rel L2";
      EXPECT_LE(w.kernel.one_minus_cos, b.kernel.one_minus_cos) << what << " kernel 1 - cos";
      EXPECT_LE(w.recipe_error.rel_l2, b.recipe_error.rel_l2) << what << " recipe rel L2";
      EXPECT_LE(w.recipe_error.one_minus_cos, b.recipe_error.one_minus_cos) << what << " recipe 1 - cos";
    }
}

// Sliding windows: a causal one, and one on both sides whose rows start and
// end inside key tiles (backward_shape: Sq < Sk, so the diagonal is offset).
TEST(EmulatorBackward, WindowGradientsAgainstReference) {
  for (const AttentionOptions& base : backward_configs())
    for (const auto& [mask, window] : {std::pair{MaskKind::causal, Window{60, -1}},
                                       std::pair{MaskKind::none, Window{40, 25}}}) {
      AttentionOptions o = base;
      o.mask = mask, o.window = window;
      const BackwardBounds& b = bounds_for(o);
      const Worst w = measure(backward_shape(), kTestSeed, o);
      const std::string what = testing::describe(o) + " window " + std::to_string(window.left) + "," +
                               std::to_string(window.right);
      EXPECT_LE(w.kernel.rel_l2, b.kernel.rel_l2) << what << " kernel rel L2";
      EXPECT_LE(w.kernel.one_minus_cos, b.kernel.one_minus_cos) << what << " kernel 1 - cos";
      EXPECT_LE(w.recipe_error.rel_l2, b.recipe_error.rel_l2) << what << " recipe rel L2";
      EXPECT_LE(w.recipe_error.one_minus_cos, b.recipe_error.one_minus_cos) << what << " recipe 1 - cos";
    }
}

// Sq > Sk with bottom-right causal leaves rows with no key: their dQ is zero
// and they add nothing to dK, dV.
TEST(EmulatorBackward, FullyMaskedRowsHaveZeroGradient) {
  const AttentionShape s{.B = 1, .Hq = 1, .Hkv = 1, .Sq = 96, .Sk = 64, .D = 64};
  const Inputs x = testing::realistic_inputs(s, kTestSeed);
  std::vector<float> d_o(x.q);
  AttentionOptions o;
  o.mask = MaskKind::causal, o.block_q = 32, o.block_k = 32;
  const ForwardResult fwd = forward(s, x.q, x.k, x.v, o);
  const BackwardResult g = backward(s, x.q, x.k, x.v, fwd.o, fwd.lse, d_o, o);
  for (std::int64_t i = 0; i < (s.Sq - s.Sk) * s.D; ++i) ASSERT_EQ(g.dq[i], 0.0f) << i;
  EXPECT_NE(g.dq[(s.Sq - s.Sk + 1) * s.D], 0.0f);
  for (float e : g.dk) ASSERT_TRUE(std::isfinite(e));
}

// The backward's twin of EmulatorForward.ZeroChannelsChangeNoBit: zero
// channels appended to Q, K, V, O and dO change no bit of the first D columns
// of dQ, dK and dV (and leave the extra columns zero), with the softmax scale
// of D, for both recipes with a backward.
TEST(EmulatorBackward, ZeroChannelsChangeNoBit) {
  for (const auto& [d, d_pad] : {std::pair{96, 128}, std::pair{32, 64}, std::pair{80, 128}, std::pair{72, 128}}) {
    const AttentionShape s{.B = 1, .Hq = 2, .Hkv = 1, .Sq = 70, .Sk = 150, .D = d};
    const AttentionShape sp = dispatch::with_head_dim(s, d_pad);
    const Inputs x = testing::realistic_inputs(s, kTestSeed);
    const auto pad = [&](std::span<const float> a) { return append_zero_channels(a, d, d_pad); };
    std::vector<float> d_o(x.q.rbegin(), x.q.rend());
    for (Recipe r : {Recipe::fp8, Recipe::mxfp4_train})
      for (Target t : {Target::sm90, Target::sm100}) {
        if (r == Recipe::fp8 && t == Target::sm100) continue;
        AttentionOptions o;
        o.recipe = r, o.target = t, o.mask = MaskKind::causal;
        o.softmax_scale = 1.0f / std::sqrt(static_cast<float>(d));
        const ForwardResult f = forward(s, x.q, x.k, x.v, o);
        const BackwardResult a = backward(s, x.q, x.k, x.v, f.o, f.lse, d_o, o);
        const ForwardResult fp = forward(sp, pad(x.q), pad(x.k), pad(x.v), o);
        const BackwardResult b = backward(sp, pad(x.q), pad(x.k), pad(x.v), fp.o, fp.lse, pad(d_o), o);
        EXPECT_EQ(a.dq, first_channels(b.dq, d_pad, d)) << d << " " << to_string(r) << " " << to_string(t);
        EXPECT_EQ(a.dk, first_channels(b.dk, d_pad, d)) << d << " " << to_string(r) << " " << to_string(t);
        EXPECT_EQ(a.dv, first_channels(b.dv, d_pad, d)) << d << " " << to_string(r) << " " << to_string(t);
        for (const std::vector<float>* g : {&b.dq, &b.dk, &b.dv})
          for (std::size_t row = 0; row < g->size() / d_pad; ++row)
            for (int c = d; c < d_pad; ++c) ASSERT_EQ((*g)[row * d_pad + c], 0.0f);
      }
  }
}

// mxfp4_train on target sm90 folds Q per query tile for the backward (the
// forward folds per row): one row 2^20 above the rest of its tile flushes the
// others' MX blocks (more than 14 binades below the tile's largest) to E4M3
// subnormals or zero, so their recomputed scores and dQ change. Rows of other
// tiles keep exactly their gradients. Target sm100 multiplies exact MXFP4
// values: there the loud row moves its tile's other rows only through the
// pair's shared dS scale.
TEST(EmulatorBackward, Sm90FoldsMxQueriesPerTile) {
  const AttentionShape s{.B = 1, .Hq = 1, .Hkv = 1, .Sq = 64, .Sk = 64, .D = 64};
  constexpr std::int64_t kTile = 32, kLoudRow = 5;
  const Inputs x = testing::realistic_inputs(s, kTestSeed);
  std::vector<float> loud_q = x.q;
  for (std::int64_t d = 0; d < s.D; ++d) loud_q[kLoudRow * s.D + d] *= 1048576.0f;
  std::mt19937_64 gen(kTestSeed + 1);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> d_o(s.q_elems());
  for (float& e : d_o) e = normal(gen);
  // rel L2 of dQ between the plain and the loud input, over tile 0's quiet rows and over tile 1.
  const auto moved = [&](Target target) {
    AttentionOptions o;
    o.recipe = Recipe::mxfp4_train, o.target = target, o.block_q = kTile, o.block_k = kTile;
    const ForwardResult f = forward(s, x.q, x.k, x.v, o), fl = forward(s, loud_q, x.k, x.v, o);
    const BackwardResult g = backward(s, x.q, x.k, x.v, f.o, f.lse, d_o, o);
    const BackwardResult gl = backward(s, loud_q, x.k, x.v, fl.o, fl.lse, d_o, o);
    std::vector<float> quiet, quiet_loud, tile1, tile1_loud;
    for (std::int64_t i = 0; i < s.Sq; ++i) {
      if (i == kLoudRow) continue;
      auto& a = i < kTile ? quiet : tile1;
      auto& b = i < kTile ? quiet_loud : tile1_loud;
      a.insert(a.end(), g.dq.begin() + i * s.D, g.dq.begin() + (i + 1) * s.D);
      b.insert(b.end(), gl.dq.begin() + i * s.D, gl.dq.begin() + (i + 1) * s.D);
    }
    EXPECT_EQ(tile1, tile1_loud) << to_string(target) << ": rows of another query tile moved";
    return compare(quiet_loud, quiet).rel_l2;
  };
  const double sm90 = moved(Target::sm90), sm100 = moved(Target::sm100);
  std::printf("loud row moves its tile's other dQ rows by rel L2 %.3e (sm90), %.3e (sm100)\n", sm90, sm100);
  EXPECT_GT(sm90, 0.5);
  EXPECT_LT(sm100, 0.1);
}

// dQ's dS scale blocks: one per 64 query rows (dq_ds_rows, the default)
// models the sm90 dQ kernel, one per pair (dq_ds_rows = block_q) the one-pass
// backward. Only dQ depends on them: dK and dV keep the pair's scale, bit for
// bit. Rows 64 .. 127 of every tile have dO 2^10 louder, so the halves'
// scales differ and so do the two dQ; a half's own scale suits its quiet
// rows better, so their dQ is then nearer the fp64 gradient on the same
// operands.
TEST(EmulatorBackward, DqScaleBlocksMoveDqOnly) {
  const AttentionShape s{.B = 1, .Hq = 2, .Hkv = 1, .Sq = 256, .Sk = 256, .D = 64};
  const Inputs x = testing::realistic_inputs(s, kTestSeed);
  std::mt19937_64 gen(kTestSeed + 2);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> d_o(s.q_elems());
  for (std::int64_t i = 0; i < s.Sq * s.Hq; ++i)
    for (std::int64_t d = 0; d < s.D; ++d) d_o[i * s.D + d] = normal(gen) * ((i / s.Hq) % 128 >= 64 ? 1024.0f : 1.0f);
  AttentionOptions halves;
  halves.mask = MaskKind::causal;
  AttentionOptions pair = halves;
  pair.dq_ds_rows = pair.block_q;
  ASSERT_EQ(halves.dq_ds_rows, 64);
  const ForwardResult f = forward(s, x.q, x.k, x.v, halves);
  const BackwardResult a = backward(s, x.q, x.k, x.v, f.o, f.lse, d_o, halves);
  const BackwardResult b = backward(s, x.q, x.k, x.v, f.o, f.lse, d_o, pair);
  EXPECT_EQ(a.dk, b.dk);
  EXPECT_EQ(a.dv, b.dv);
  // dQ of the quiet rows (loud ones dominate any norm over all rows).
  const auto quiet = [&](const auto& dq) {
    std::vector<std::decay_t<decltype(dq[0])>> out;
    for (std::int64_t i = 0; i < s.Sq * s.Hq; ++i)
      if ((i / s.Hq) % 128 < 64) out.insert(out.end(), dq.begin() + i * s.D, dq.begin() + (i + 1) * s.D);
    return out;
  };
  const double apart = compare(quiet(a.dq), quiet(b.dq)).rel_l2;
  const reference::BackwardResult exact = reference_on_quantized(s, x, d_o, halves);
  const double halves_err = compare(quiet(a.dq), quiet(exact.dq)).rel_l2;
  const double pair_err = compare(quiet(b.dq), quiet(exact.dq)).rel_l2;
  std::printf("quiet rows' dq: the two block shapes apart by rel L2 %.3e; against fp64 %.3e (halves), %.3e (pair)\n",
              apart, halves_err, pair_err);
  EXPECT_GT(apart, 1e-3);
  EXPECT_LT(halves_err, pair_err);
  pair.dq_ds_rows = 0;
  try {
    (void)backward(s, x.q, x.k, x.v, f.o, f.lse, d_o, pair);
    ADD_FAILURE() << "dq_ds_rows = 0 accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), "dq_ds_rows");
  }
}

TEST(EmulatorBackward, InferenceRecipesHaveNoBackward) {
  const AttentionShape s{.B = 1, .Hq = 1, .Hkv = 1, .Sq = 32, .Sk = 32, .D = 64};
  const Inputs x = testing::realistic_inputs(s, kTestSeed);
  const std::vector<float> o(s.q_elems(), 0.5f), lse(s.lse_elems(), 1.0f);
  for (Recipe r : {Recipe::mxfp4, Recipe::nvfp4}) {
    AttentionOptions opt;
    opt.recipe = r;
    try {
      backward(s, x.q, x.k, x.v, o, lse, x.q, opt);
      ADD_FAILURE() << to_string(r) << " ran a backward";
    } catch (const Error& e) {
      EXPECT_EQ(e.argument(), "recipe");
    }
  }
}

TEST(EmulatorBackwardCalibration, DISABLED_PrintBounds) {
  std::printf("| recipe | target | dS | Direct-P | smooth_k | kernel rel L2 | kernel 1-cos | recipe rel L2 | recipe 1-cos |\n"
              "|---|---|---|---|---|---|---|---|---|\n");
  std::string rows;
  for (const AttentionOptions& base : backward_configs()) {
    Worst w;
    for (std::uint64_t seed = 1; seed <= kCalibrationSeeds; ++seed)
      for (MaskKind mask : {MaskKind::none, MaskKind::causal}) {
        AttentionOptions o = base;
        o.mask = mask;
        const Worst m = measure(backward_shape(), seed, o);
        w.kernel = {std::max(w.kernel.rel_l2, m.kernel.rel_l2), std::max(w.kernel.one_minus_cos, m.kernel.one_minus_cos)};
        w.recipe_error = {std::max(w.recipe_error.rel_l2, m.recipe_error.rel_l2),
                          std::max(w.recipe_error.one_minus_cos, m.recipe_error.one_minus_cos)};
      }
    const char* ds = base.ds_format == GradFormat::e5m2 ? "e5m2" : "e4m3";
    std::printf("| %s | %s | %s | %s | %s | %.2e | %.2e | %.2e | %.2e |\n", std::string(to_string(base.recipe)).c_str(),
                std::string(to_string(base.target)).c_str(), ds, base.direct_p ? "on" : "off",
                base.smooth_k ? "on" : "off", w.kernel.rel_l2, w.kernel.one_minus_cos, w.recipe_error.rel_l2,
                w.recipe_error.one_minus_cos);
    char line[256];
    std::snprintf(line, sizeof line, "    {Recipe::%s, Target::%s, GradFormat::%s, %s, %s, {%.2e, %.2e}, {%.2e, %.2e}},\n",
                  std::string(to_string(base.recipe)).c_str(), std::string(to_string(base.target)).c_str(), ds,
                  base.direct_p ? "true" : "false", base.smooth_k ? "true" : "false", 2 * w.kernel.rel_l2,
                  2 * w.kernel.one_minus_cos, 2 * w.recipe_error.rel_l2, 2 * w.recipe_error.one_minus_cos);
    rows += line;
  }
  std::printf("\n%s", rows.c_str());
}

}  // namespace
}  // namespace fp4attn::emulator
