// Recipe fp8's forward on caller-quantized E4M3 inputs (FlashAttention-3's
// FP8 interface) on the H200 against the emulator on the same codes and
// descales: the kernel reads Q and K in place, the descales become its
// scales, V is transposed by the preparation pass. Strided views give the
// dense call's bits; a NaN code or a bad descale makes every output NaN.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "dispatch/sm90_executor.hpp"
#include "e4m3_inputs_fixture.hpp"
#include "fp4attn/attention.hpp"
#include "fp4attn/emulator.hpp"
#include "fp4attn/error.hpp"
#include "gpu/e4m3_device_run.hpp"
#include "gpu/forward_check.hpp"
#include "gpu/gpu_test_util.hpp"

namespace fp4attn::gpu_test {
namespace {

using e4m3_test::Problem;
using e4m3_test::random_problem;

AttentionOptions e4m3_options(MaskKind mask, bool direct_p = true, Window window = {}) {
  AttentionOptions opt;
  opt.recipe = Recipe::fp8;
  opt.smooth_k = false;
  opt.mask = mask;
  opt.direct_p = direct_p;
  opt.window = window;
  return opt;
}

struct E4m3Case {
  AttentionShape shape;
  MaskKind mask;
  bool direct_p;
  Window window;
};

std::string case_name(const testing::TestParamInfo<E4m3Case>& info) {
  const E4m3Case& c = info.param;
  std::string name = shape_mask_name(c.shape, c.mask) + (c.direct_p ? "_directp" : "_exp2");
  if (c.window.left >= 0 || c.window.right >= 0)
    name += "_window" + std::to_string(c.window.left) + "_" + std::to_string(c.window.right < 0 ? 0 : c.window.right);
  return name;
}

class GpuForwardE4m3Grid : public testing::TestWithParam<E4m3Case> {};

TEST_P(GpuForwardE4m3Grid, MatchesEmulator) {
  FP4ATTN_REQUIRE_HOPPER();
  const E4m3Case& c = GetParam();
  const std::uint32_t seed = fresh_seed();
  const Problem p = random_problem(c.shape, seed);
  const AttentionOptions opt = e4m3_options(c.mask, c.direct_p, c.window);
  const ForwardOutput gpu = forward_e4m3(c.shape, p.inputs(), opt, Executor::sm90);
  ASSERT_EQ(gpu.executor, Executor::sm90);
  const ForwardOutput emu = forward_e4m3(c.shape, p.inputs(), opt, Executor::emulator);
  expect_forward_matches_emulator(gpu.o, gpu.lse, emulator::ForwardResult{emu.o, emu.lse}, "e4m3",
                                  "seed " + std::to_string(seed));
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, GpuForwardE4m3Grid,
    testing::Values(E4m3Case{{2, 4, 2, 200, 333, 64}, MaskKind::causal, true, {}},
                    E4m3Case{{2, 4, 2, 200, 333, 64}, MaskKind::none, false, {}},
                    E4m3Case{{1, 8, 2, 513, 1000, 128}, MaskKind::none, true, {}},
                    E4m3Case{{2, 2, 1, 300, 150, 128}, MaskKind::causal, true, {}},  // Sq > Sk: rows that see no key
                    E4m3Case{{1, 4, 4, 384, 384, 128}, MaskKind::causal_top_left, true, {}},
                    E4m3Case{{1, 4, 2, 700, 900, 128}, MaskKind::none, true, {100, 37}},
                    E4m3Case{{2, 4, 2, 200, 333, 256}, MaskKind::causal, true, {}},
                    E4m3Case{{1, 4, 2, 300, 333, 48}, MaskKind::causal, true, {}},  // zero channels by TMA
                    E4m3Case{{1, 3, 1, 257, 129, 80}, MaskKind::none, true, {}},
                    E4m3Case{{3, 2, 2, 1, 77, 96}, MaskKind::none, true, {}},
                    // the Vᵀ pass's CTAs of several kv heads: three at D = 64, eight at D = 32
                    E4m3Case{{2, 6, 3, 150, 290, 64}, MaskKind::none, true, {}},
                    E4m3Case{{1, 8, 8, 100, 260, 32}, MaskKind::causal, false, {}}),
    case_name);

// One zero-copy call on device copies of a problem's codes, each tensor laid
// out with `pad` spare bytes after every (b, s, h) row (0: dense).
struct DeviceCall {
  AttentionShape shape;
  std::int64_t pad;
  DeviceArray<std::uint8_t> q, k, v;
  DeviceArray<float> q_descale, k_descale, v_descale;
  DeviceArray<std::uint16_t> o;
  DeviceArray<float> lse;
  DeviceArray<unsigned char> workspace;

  DeviceCall(const Problem& p, std::int64_t row_pad)
      : shape(p.shape),
        pad(row_pad),
        q(static_cast<std::size_t>(p.shape.q_elems() / p.shape.D * (p.shape.D + row_pad))),
        k(static_cast<std::size_t>(p.shape.kv_elems() / p.shape.D * (p.shape.D + row_pad))),
        v(static_cast<std::size_t>(p.shape.kv_elems() / p.shape.D * (p.shape.D + row_pad))),
        q_descale(p.q_descale.size()),
        k_descale(p.k_descale.size()),
        v_descale(p.v_descale.size()),
        o(static_cast<std::size_t>(p.shape.q_elems())),
        lse(static_cast<std::size_t>(p.shape.lse_elems())),
        workspace(dispatch::sm90_device_e4m3_workspace_bytes(p.shape)) {
    q.upload(padded(p.q)), k.upload(padded(p.k)), v.upload(padded(p.v));
    q_descale.upload(p.q_descale), k_descale.upload(p.k_descale), v_descale.upload(p.v_descale);
  }

  std::vector<std::uint8_t> padded(const std::vector<std::uint8_t>& x) const {
    const std::int64_t rows = static_cast<std::int64_t>(x.size()) / shape.D;
    std::vector<std::uint8_t> out(static_cast<std::size_t>(rows * (shape.D + pad)), 0x7F);  // NaN in the gaps
    for (std::int64_t r = 0; r < rows; ++r)
      std::copy_n(x.begin() + r * shape.D, shape.D, out.begin() + r * (shape.D + pad));
    return out;
  }

  dispatch::DeviceE4m3ForwardArgs args() {
    const std::int64_t row = shape.D + pad;
    dispatch::DeviceE4m3ForwardArgs a;
    a.shape = shape;
    a.q = {q.ptr, shape.Sq * shape.Hq * row, shape.Hq * row, row};
    a.k = {k.ptr, shape.Sk * shape.Hkv * row, shape.Hkv * row, row};
    a.v = {v.ptr, shape.Sk * shape.Hkv * row, shape.Hkv * row, row};
    a.q_descale = q_descale.ptr, a.k_descale = k_descale.ptr, a.v_descale = v_descale.ptr;
    a.o = o.ptr;
    a.o_stride_b = shape.Sq * shape.Hq * shape.D, a.o_stride_s = shape.Hq * shape.D, a.o_stride_h = shape.D;
    a.lse = lse.ptr;
    a.workspace = workspace.ptr, a.workspace_bytes = workspace.bytes();
    return a;
  }

  ForwardOutput run(const AttentionOptions& opt) { return run(args(), opt); }

  // The call with `a` (args() as changed by a test), outputs poisoned first.
  ForwardOutput run(const dispatch::DeviceE4m3ForwardArgs& a, const AttentionOptions& opt) {
    return run_e4m3_device(a, opt, o, lse);
  }
};

// Rows 32 bytes wider than D (NaN codes in the gaps, which must stay unread)
// give the dense call's O and LSE bit for bit.
TEST(GpuForwardE4m3, StridedViewsGiveTheDenseBits) {
  FP4ATTN_REQUIRE_HOPPER();
  const AttentionShape shape{2, 4, 2, 200, 333, 128};
  const Problem p = random_problem(shape, fresh_seed());
  const AttentionOptions opt = e4m3_options(MaskKind::causal);
  DeviceCall dense(p, 0), strided(p, 32);
  const ForwardOutput a = dense.run(opt), b = strided.run(opt);
  for (float x : a.o) ASSERT_FALSE(std::isnan(x));
  EXPECT_EQ(a.o, b.o);
  EXPECT_EQ(a.lse, b.lse);
  // And the host entry point's answer is this one.
  const ForwardOutput host = forward_e4m3(shape, p.inputs(), opt, Executor::sm90);
  EXPECT_EQ(host.o, a.o);
  EXPECT_EQ(host.lse, a.lse);
}

// The device cannot raise an error without a synchronisation: a NaN code or a
// descale that is not finite and positive makes every O and LSE element NaN.
TEST(GpuForwardE4m3, BadValuesMakeEveryOutputNaN) {
  FP4ATTN_REQUIRE_HOPPER();
  const AttentionShape shape{1, 2, 1, 130, 260, 64};
  const Problem base = random_problem(shape, fresh_seed());
  const auto all_nan = [](const ForwardOutput& r) {
    for (float x : r.o)
      if (!std::isnan(x)) return false;
    for (float x : r.lse)
      if (!std::isnan(x)) return false;
    return true;
  };
  const AttentionOptions opt = e4m3_options(MaskKind::none);
  {
    DeviceCall good(base, 0);
    EXPECT_FALSE(all_nan(good.run(opt)));
  }
  const auto with = [&](auto&& change) {
    Problem p = base;
    change(p);
    DeviceCall call(p, 0);
    return all_nan(call.run(opt));
  };
  EXPECT_TRUE(with([](Problem& p) { p.q[5] = 0x7F; })) << "NaN code in q";
  EXPECT_TRUE(with([](Problem& p) { p.k.back() = 0xFF; })) << "NaN code in k";
  EXPECT_TRUE(with([](Problem& p) { p.v[1000] = 0x7F; })) << "NaN code in v";
  EXPECT_TRUE(with([](Problem& p) { p.q_descale[0] = -1.0f; })) << "negative q_descale";
  EXPECT_TRUE(with([](Problem& p) { p.k_descale[0] = 0.0f; })) << "zero k_descale";
  EXPECT_TRUE(with([](Problem& p) { p.v_descale[0] = NAN; })) << "NaN v_descale";
}

// 320 query heads of D = 128: 2560 16-byte chunks a token, more than one scan
// CTA takes (2048), so each token's codes are split over two of them. A NaN
// code in the last head of the last token is still found, and without it the
// answer is the emulator's.
TEST(GpuForwardE4m3, TokensWiderThanAScanCta) {
  FP4ATTN_REQUIRE_HOPPER();
  const AttentionShape shape{1, 320, 8, 40, 50, 128};
  const std::uint32_t seed = fresh_seed();
  const Problem base = random_problem(shape, seed);
  const AttentionOptions opt = e4m3_options(MaskKind::none);
  {
    DeviceCall call(base, 0);
    const ForwardOutput gpu = call.run(opt);
    const ForwardOutput emu = forward_e4m3(shape, base.inputs(), opt, Executor::emulator);
    expect_forward_matches_emulator(gpu.o, gpu.lse, emulator::ForwardResult{emu.o, emu.lse}, "e4m3",
                                    "320 heads, seed " + std::to_string(seed));
  }
  Problem bad = base;
  bad.q.back() = 0xFF;
  DeviceCall call(bad, 0);
  const ForwardOutput r = call.run(opt);
  std::size_t finite = 0;
  for (float x : r.o) finite += !std::isnan(x);
  EXPECT_EQ(finite, 0u) << "a NaN code in the last head of the last token";
}

TEST(GpuForwardE4m3, RefusesMisalignedViewsByName) {
  FP4ATTN_REQUIRE_HOPPER();
  const AttentionShape shape{1, 2, 1, 64, 64, 64};
  const Problem p = random_problem(shape, 1);
  DeviceCall call(p, 0);
  const AttentionOptions opt = e4m3_options(MaskKind::none);
  const auto argument_of = [&](dispatch::DeviceE4m3ForwardArgs a) -> std::string {
    try {
      dispatch::sm90_forward_device_e4m3(a, opt, nullptr);
    } catch (const Error& e) {
      return e.argument();
    }
    return "(no error)";
  };
  dispatch::DeviceE4m3ForwardArgs a = call.args();
  a.q.stride_s += 8;
  EXPECT_EQ(argument_of(a), "q");
  a = call.args();
  a.k.data = static_cast<const std::uint8_t*>(a.k.data) + 8;
  EXPECT_EQ(argument_of(a), "k");
  a = call.args();
  a.v.stride_s = 72;
  EXPECT_EQ(argument_of(a), "v");
  a = call.args();
  a.workspace_bytes -= 1;
  EXPECT_EQ(argument_of(a), "workspace");
}

// A dimension of size 1 is never stepped over: whatever stride a framework
// gave it (here 1, and B's 3), the call reads the tensor as dense.
TEST(GpuForwardE4m3, StridesOfSizeOneDimensionsAreIgnored) {
  FP4ATTN_REQUIRE_HOPPER();
  const AttentionShape shape{1, 1, 1, 100, 140, 64};
  const Problem p = random_problem(shape, fresh_seed());
  const AttentionOptions opt = e4m3_options(MaskKind::causal);
  DeviceCall call(p, 0);
  const ForwardOutput want = call.run(opt);
  dispatch::DeviceE4m3ForwardArgs a = call.args();
  a.q.stride_h = 1, a.k.stride_h = 1, a.v.stride_h = 1;
  a.q.stride_b = 3, a.k.stride_b = 3, a.v.stride_b = 3;
  const ForwardOutput got = call.run(a, opt);
  EXPECT_EQ(got.o, want.o);
  EXPECT_EQ(got.lse, want.lse);
}

}  // namespace
}  // namespace fp4attn::gpu_test
