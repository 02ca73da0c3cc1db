// fp4attn::backward and the device backward's argument checks: every bad
// argument is named; without a Hopper GPU automatic dispatch runs the
// emulator and returns exactly its gradients.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "dispatch/sm90_executor.hpp"
#include "fp4attn/attention.hpp"
#include "fp4attn/emulator.hpp"
#include "fp4attn/error.hpp"

namespace fp4attn {
namespace {

struct Inputs {
  AttentionShape shape{1, 2, 1, 70, 90, 64};
  std::vector<float> q, k, v, o, lse, d_o;
  AttentionOptions opt;
  Inputs() {
    std::mt19937 rng(std::random_device{}());
    std::normal_distribution<float> normal(0.0f, 1.0f);
    const auto fill = [&](std::int64_t n) {
      std::vector<float> x(static_cast<std::size_t>(n));
      for (float& e : x) e = normal(rng);
      return x;
    };
    q = fill(shape.q_elems()), k = fill(shape.kv_elems()), v = fill(shape.kv_elems()), d_o = fill(shape.q_elems());
    opt.mask = MaskKind::causal;
    const emulator::ForwardResult f = emulator::forward(shape, q, k, v, opt);
    o = f.o, lse = f.lse;
  }
  BackwardOutput run(Executor e = Executor::automatic) const { return backward(shape, q, k, v, o, lse, d_o, opt, e); }
};

// The argument fp4attn::Error names for `fn`, or "" when nothing is thrown.
template <class F>
std::string thrown_argument(F&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.argument();
  }
  return "";
}

TEST(BackwardApi, NamesTensorsWithWrongSizes) {
  Inputs in;
  for (const char* name : {"q", "k", "v", "o", "lse", "d_o"}) {
    Inputs bad = in;
    std::vector<float>& x = std::string(name) == "q"     ? bad.q
                            : std::string(name) == "k"   ? bad.k
                            : std::string(name) == "v"   ? bad.v
                            : std::string(name) == "o"   ? bad.o
                            : std::string(name) == "lse" ? bad.lse
                                                         : bad.d_o;
    x.pop_back();
    EXPECT_EQ(thrown_argument([&] { bad.run(); }), name);
  }
}

TEST(BackwardApi, NamesNonFiniteInputs) {
  Inputs in;
  for (const char* name : {"q", "o", "d_o"}) {
    Inputs bad = in;
    std::vector<float>& x = std::string(name) == "q" ? bad.q : std::string(name) == "o" ? bad.o : bad.d_o;
    x[3] = NAN;
    EXPECT_EQ(thrown_argument([&] { bad.run(); }), name);
  }
  Inputs bad = in;
  bad.lse[1] = INFINITY;
  EXPECT_EQ(thrown_argument([&] { bad.run(); }), "lse");
  bad.lse[1] = NAN;
  EXPECT_EQ(thrown_argument([&] { bad.run(); }), "lse");
}

TEST(BackwardApi, RefusesInferenceRecipesAndBadShapes) {
  Inputs in;
  in.opt.recipe = Recipe::mxfp4;
  EXPECT_EQ(thrown_argument([&] { in.run(); }), "recipe");
  Inputs odd;
  odd.shape.Hkv = 3;  // Hq = 2 is not a multiple
  EXPECT_FALSE(thrown_argument([&] { odd.run(); }).empty());
  Inputs d;
  d.opt.block_q = 100;
  EXPECT_EQ(thrown_argument([&] { d.run(); }), "block_q");
}

TEST(BackwardApi, AutomaticMatchesTheEmulatorWithoutAGpu) {
  if (sm90_available()) GTEST_SKIP() << "a Hopper GPU runs the sm90 backward (tests/gpu/test_bwd_gpu.cu)";
  Inputs in;
  const BackwardOutput got = in.run();
  EXPECT_EQ(got.executor, Executor::emulator);
  const emulator::BackwardResult want = emulator::backward(in.shape, in.q, in.k, in.v, in.o, in.lse, in.d_o, in.opt);
  EXPECT_EQ(got.dq, want.dq);
  EXPECT_EQ(got.dk, want.dk);
  EXPECT_EQ(got.dv, want.dv);
  EXPECT_EQ(thrown_argument([&] { in.run(Executor::sm90); }), "executor");
}

TEST(BackwardApi, Sm90RefusesWhatItDoesNotImplement) {
  Inputs in;
  in.opt.ds_format = GradFormat::e5m2;  // the emulator has it, the kernels do not
  EXPECT_FALSE(dispatch::sm90_backward_supports(in.shape, in.opt));
  EXPECT_EQ(thrown_argument([&] { in.run(Executor::sm90); }), "executor");
  Inputs d96;
  d96.shape.D = 96;
  EXPECT_FALSE(dispatch::sm90_backward_supports(d96.shape, d96.opt));
  // mxfp4_train runs on the kernels for target sm90 only: sm100's numerics exist in the emulator alone.
  Inputs mx;
  mx.opt.recipe = Recipe::mxfp4_train;
  EXPECT_EQ(dispatch::sm90_backward_supports(mx.shape, mx.opt), cuda_built());
  mx.opt.target = Target::sm100;
  EXPECT_FALSE(dispatch::sm90_backward_supports(mx.shape, mx.opt));
  EXPECT_EQ(thrown_argument([&] { mx.run(Executor::sm90); }), "executor");
}

// The mean number of keys a row sees, against a count row by row, and the
// backward-mode rule built on it (D = 64, at least 1024 keys a row).
TEST(BackwardApi, OnePassRuleCountsTheKeysRowsSee) {
  for (const MaskKind mask : {MaskKind::none, MaskKind::causal, MaskKind::causal_top_left})
    for (const auto& [sq, sk] : {std::pair<std::int64_t, std::int64_t>{1024, 1024}, {300, 1400}, {1400, 300},
                                 {4096, 128}, {1, 1}, {129, 7}}) {
      double sum = 0.0;
      for (std::int64_t i = 0; i < sq; ++i) {
        const std::int64_t last = mask == MaskKind::none ? sk - 1 : mask == MaskKind::causal ? i + sk - sq : i;
        sum += static_cast<double>(std::clamp<std::int64_t>(last + 1, 0, sk));
      }
      EXPECT_DOUBLE_EQ(dispatch::mean_visible_keys(mask, sq, sk), sum / static_cast<double>(sq))
          << "mask " << static_cast<int>(mask) << " Sq=" << sq << " Sk=" << sk;
    }
  const auto shape = [](std::int64_t sq, std::int64_t sk, std::int64_t d) {
    AttentionShape s;
    s.B = 2, s.Sq = sq, s.Sk = sk, s.Hq = 4, s.Hkv = 2, s.D = d;
    return s;
  };
  EXPECT_TRUE(dispatch::sm90_backward_one_pass_faster(shape(1024, 1024, 64), MaskKind::none));
  EXPECT_FALSE(dispatch::sm90_backward_one_pass_faster(shape(1024, 1024, 128), MaskKind::none));
  EXPECT_TRUE(dispatch::sm90_backward_one_pass_faster(shape(512, 512, 64), MaskKind::causal));   // 256.5
  EXPECT_FALSE(dispatch::sm90_backward_one_pass_faster(shape(510, 510, 64), MaskKind::causal));  // 255.5
  // A sliding window: each row's keys counted the same way, from both ends.
  for (const Window w : {Window{100, -1}, Window{0, 40}, Window{300, 300}}) {
    const std::int64_t sq = 700, sk = 900;
    double sum = 0.0;
    for (std::int64_t i = 0; i < sq; ++i) {
      const std::int64_t d = sk - sq;
      const std::int64_t first = w.left < 0 ? 0 : std::max<std::int64_t>(0, i + d - w.left);
      const std::int64_t last = w.right < 0 ? sk - 1 : std::min<std::int64_t>(sk - 1, i + d + w.right);
      sum += static_cast<double>(std::max<std::int64_t>(0, last - first + 1));
    }
    EXPECT_DOUBLE_EQ(dispatch::mean_visible_keys(MaskKind::none, sq, sk, w), sum / static_cast<double>(sq))
        << w.left << "," << w.right;
  }
  // A window of 100 keys drops causal rows of 1024 below the rule's 256.
  EXPECT_FALSE(dispatch::sm90_backward_one_pass_faster(shape(1024, 1024, 64), MaskKind::causal, Window{100, 0}));
  EXPECT_FALSE(dispatch::sm90_backward_one_pass_faster(shape(255, 255, 64), MaskKind::none));
}

// Packed sequences: the same rule on the mean over every query row of the
// batch, a long sequence's rows outweighing a short one's.
TEST(BackwardApi, PackedOnePassRuleWeighsEachSequencesRows) {
  using Lens = std::vector<std::int64_t>;
  // One sequence: the batched rule.
  EXPECT_TRUE(dispatch::sm90_packed_backward_one_pass_faster(Lens{512}, Lens{512}, 64, MaskKind::causal));
  EXPECT_FALSE(dispatch::sm90_packed_backward_one_pass_faster(Lens{510}, Lens{510}, 64, MaskKind::causal));
  // (4096·4096 + 100·100) / 4196 ≈ 4001 keys a row.
  EXPECT_TRUE(dispatch::sm90_packed_backward_one_pass_faster(Lens{4096, 100}, Lens{4096, 100}, 64, MaskKind::none));
  // (200·200 + 100·3000) / 300 ≈ 1133 keys a row.
  EXPECT_TRUE(dispatch::sm90_packed_backward_one_pass_faster(Lens{200, 100}, Lens{200, 3000}, 64, MaskKind::none));
  // 100 rows of 3000 keys and 3000 rows of 100: 194 keys a row (the sequences' means average 1550).
  EXPECT_FALSE(dispatch::sm90_packed_backward_one_pass_faster(Lens{100, 3000}, Lens{3000, 100}, 64, MaskKind::none));
  EXPECT_FALSE(dispatch::sm90_packed_backward_one_pass_faster(Lens{4096}, Lens{4096}, 128, MaskKind::none));
  EXPECT_FALSE(dispatch::sm90_packed_backward_one_pass_faster(Lens{0}, Lens{0}, 64, MaskKind::none));
  EXPECT_EQ(thrown_argument([] { dispatch::sm90_packed_backward_one_pass_faster(Lens{1}, Lens{}, 64, MaskKind::none); }),
            "lens_k");
}

TEST(BackwardApi, DeviceEntryNamesNullPointersAndSmallWorkspace) {
  if (!cuda_built()) GTEST_SKIP() << "CPU-only build: the device entry only reports that";
  const AttentionShape s{1, 2, 1, 70, 90, 64};
  AttentionOptions opt;
  // Fake, never dereferenced: every check runs before anything is enqueued.
  void* fake = reinterpret_cast<void*>(std::uintptr_t{1} << 20);
  dispatch::DeviceBackwardArgs a;
  a.shape = s;
  a.q = a.k = a.v = a.o = a.d_o = {fake, 0, 0, 0};
  a.lse = static_cast<const float*>(fake);
  a.dq = a.dk = a.dv = fake;
  a.workspace = fake;
  a.workspace_bytes = dispatch::sm90_device_backward_workspace_bytes(s, true);
  EXPECT_GT(a.workspace_bytes, 0u);
  // The non-deterministic mode adds dQ into fp32 sums the deterministic one never needs:
  // (B, Hq, Sq padded to 128, D), a region rounded up to 256 bytes.
  const auto sums_bytes = static_cast<std::size_t>(s.B * s.Hq * ((s.Sq + 127) / 128 * 128) * s.D) * sizeof(float);
  const std::size_t sums_region = (sums_bytes + 255) / 256 * 256;
  EXPECT_EQ(dispatch::sm90_device_backward_workspace_bytes(s, false), a.workspace_bytes + sums_region);
  // mxfp4_train adds Q's and K's MXFP4 codes (4.25 bits per element) to the fp8 recipe's workspace.
  EXPECT_EQ(dispatch::sm90_device_backward_workspace_bytes(s, true, Recipe::fp8), a.workspace_bytes);
  const std::size_t mx_bytes = dispatch::sm90_device_backward_workspace_bytes(s, true, Recipe::mxfp4_train);
  EXPECT_GT(mx_bytes, a.workspace_bytes + static_cast<std::size_t>(s.q_elems() + s.kv_elems()) / 2);
  EXPECT_EQ(dispatch::sm90_device_backward_workspace_bytes(s, false, Recipe::mxfp4_train), mx_bytes + sums_region);
  EXPECT_EQ(thrown_argument([&] { dispatch::sm90_device_backward_workspace_bytes(s, true, Recipe::mxfp4); }),
            "recipe");
  const auto check = [&](dispatch::DeviceBackwardArgs bad) {
    return thrown_argument([&] { dispatch::sm90_backward_device(bad, opt, true, nullptr); });
  };
  auto bad = a;
  bad.lse = nullptr;
  EXPECT_EQ(check(bad), "lse");
  bad = a;
  bad.dk = nullptr;
  EXPECT_EQ(check(bad), "dk");
  bad = a;
  bad.d_o.data = nullptr;
  EXPECT_EQ(check(bad), "d_o");
  bad = a;
  bad.workspace_bytes -= 1;
  EXPECT_EQ(check(bad), "workspace");
  EXPECT_EQ(thrown_argument([&] { dispatch::sm90_backward_device(a, opt, false, nullptr); }), "workspace");
  bad = a;
  bad.shape.D = 96;  // the emulator takes it, the kernels do not
  EXPECT_EQ(check(bad), "executor");
  // The fp8 recipe's workspace is too small for mxfp4_train.
  AttentionOptions mx = opt;
  mx.recipe = Recipe::mxfp4_train;
  EXPECT_EQ(thrown_argument([&] { dispatch::sm90_backward_device(a, mx, true, nullptr); }), "workspace");
  // The forward's kept operands: for fp8 Q's and K's codes and their
  // transposed copies at least, for mxfp4_train K's and Kᵀ and Q's MXFP4
  // codes and scales (17/32 byte per element); none for the inference
  // recipes. A block too small or misaligned is refused by name.
  const std::size_t kept = dispatch::sm90_device_saved_bytes(s, Recipe::fp8);
  EXPECT_GE(kept, static_cast<std::size_t>(2 * (s.q_elems() + s.kv_elems())));
  const std::size_t mx_kept = dispatch::sm90_device_saved_bytes(s, Recipe::mxfp4_train);
  EXPECT_GE(mx_kept, static_cast<std::size_t>(2 * s.kv_elems() + s.q_elems() * 17 / 32));
  EXPECT_LT(mx_kept, kept);
  EXPECT_EQ(dispatch::sm90_device_saved_bytes(s, Recipe::mxfp4), 0u);
  EXPECT_EQ(dispatch::sm90_device_saved_bytes(s, Recipe::nvfp4), 0u);
  // Given the kept block, the workspace leaves out what it holds: fp8 Q's
  // and K's codes and their transposed copies (Sq, Sk padded to 128), for
  // mxfp4_train K's codes and Kᵀ and the MXFP4 codes, scales and scratch.
  // Each region is rounded up to 256 bytes, so the saving is at least that.
  const auto pad128 = [](std::int64_t n) { return (n + 127) / 128 * 128; };
  const auto fp8_owned = static_cast<std::size_t>(s.q_elems() + s.kv_elems() + s.B * s.Hq * s.D * pad128(s.Sq) +
                                                  s.B * s.Hkv * s.D * pad128(s.Sk));
  const std::size_t kept_ws = dispatch::sm90_device_backward_workspace_bytes(s, true, Recipe::fp8, true);
  EXPECT_LE(kept_ws + fp8_owned, a.workspace_bytes);
  EXPECT_GT(kept_ws + fp8_owned + 4 * 256, a.workspace_bytes);
  EXPECT_EQ(dispatch::sm90_device_backward_workspace_bytes(s, false, Recipe::fp8, true), kept_ws + sums_region);
  const std::size_t mx_kept_ws = dispatch::sm90_device_backward_workspace_bytes(s, true, Recipe::mxfp4_train, true);
  EXPECT_LE(mx_kept_ws + static_cast<std::size_t>(s.kv_elems() + s.B * s.Hkv * s.D * pad128(s.Sk)) +
                static_cast<std::size_t>(s.q_elems() + s.kv_elems()) / 2,
            mx_bytes);
  EXPECT_GT(mx_kept_ws, kept_ws);  // mxfp4_train folds the kept Q into its own codes and Qᵀ
  bad = a;
  bad.workspace_bytes = kept_ws;  // without the kept block the call needs the full workspace
  EXPECT_EQ(check(bad), "workspace");
  bad = a;
  bad.saved = fake, bad.saved_bytes = kept - 1;
  EXPECT_EQ(check(bad), "saved");
  bad.saved = static_cast<const char*>(fake) + 16, bad.saved_bytes = kept;
  EXPECT_EQ(check(bad), "saved");
  bad = a;
  bad.saved = fake, bad.saved_bytes = mx_kept - 1;
  bad.workspace_bytes = dispatch::sm90_device_backward_workspace_bytes(s, true, Recipe::mxfp4_train);
  EXPECT_EQ(thrown_argument([&] { dispatch::sm90_backward_device(bad, mx, true, nullptr); }), "saved");
}

// Packed sequences lay every per-token buffer out tile-aligned, sequence
// after sequence: the forward's workspace, the saved block and the
// backward's workspace grow with the tokens in all, not with the number of
// sequences times the longest (one sequence of 32768 tokens and 64 of 512:
// 65 · 32768 rows in the (B, longest) layout, at most 65536 + 65 · 127
// packed).
TEST(BackwardApi, PackedLayoutsGrowWithTheTokens) {
  if (!cuda_built()) GTEST_SKIP() << "CPU-only build: the device sizes are 0 there";
  const AttentionShape s{65, 32, 8, 32768, 32768, 128};
  const dispatch::PackedTokens packed{32768 + 64 * 512, 32768 + 64 * 512};
  const auto rows = (packed.q + 127 * s.B + 127) / 128 * 128;  // the layout's bound
  // Q's codes alone take rows · Hq · D bytes in the packed layout.
  const auto q_codes = static_cast<std::size_t>(rows * s.Hq * s.D);
  for (const auto& [dense, tiled] :
       {std::pair{dispatch::sm90_device_workspace_bytes(s, Recipe::fp8),
                  dispatch::sm90_device_workspace_bytes(s, Recipe::fp8, packed)},
        std::pair{dispatch::sm90_device_saved_bytes(s, Recipe::fp8),
                  dispatch::sm90_device_saved_bytes(s, Recipe::fp8, packed)},
        std::pair{dispatch::sm90_device_backward_workspace_bytes(s, false, Recipe::fp8, true),
                  dispatch::sm90_device_backward_workspace_bytes(s, false, Recipe::fp8, true, packed)}}) {
    EXPECT_GT(tiled, q_codes);
    EXPECT_LT(tiled * 20, dense);  // 65 · 32768 / 73984 ≈ 29 times the rows
  }
  // Per-token bytes: doubling the tokens about doubles the block.
  const dispatch::PackedTokens twice{2 * packed.q, 2 * packed.k};
  const std::size_t one = dispatch::sm90_device_saved_bytes(s, Recipe::fp8, packed);
  const std::size_t two = dispatch::sm90_device_saved_bytes(s, Recipe::fp8, twice);
  EXPECT_GT(two, one * 17 / 10);
  EXPECT_LT(two, one * 2);
  // Only recipe fp8 runs packed on the device, and packed calls need both counts.
  EXPECT_EQ(thrown_argument([&] { dispatch::sm90_device_workspace_bytes(s, Recipe::mxfp4, packed); }), "recipe");
  EXPECT_EQ(thrown_argument([&] { dispatch::sm90_device_workspace_bytes(s, Recipe::fp8, {packed.q, 0}); }),
            "cu_seqlens");
}

}  // namespace
}  // namespace fp4attn
