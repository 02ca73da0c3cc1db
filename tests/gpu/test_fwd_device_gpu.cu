// GPU suite of the zero-copy forward (dispatch::sm90_forward_device, what the
// PyTorch layer's CUDA path calls), for recipes fp8, mxfp4_train and mxfp4 and
// recipe nvfp4's exp2 baseline (its Direct-P path: the nvfp4 suite): it
// agrees with the host entry point on the same bf16 inputs, and non-finite
// input, which it cannot report without a host synchronisation, makes every
// output NaN instead of plausible numbers.
#include <cmath>
#include <string>
#include <vector>

#include "dispatch/sm90_executor.hpp"
#include "fp4attn/attention.hpp"
#include "fp4attn/error.hpp"
#include "fp4attn/metrics.hpp"
#include "gpu/device_forward_args.hpp"
#include "gpu/gpu_test_util.hpp"

namespace fp4attn {
namespace {

using gpu_test::DeviceArray;

// One device call on bf16 (B, S, H, D) tensors, its workspace and outputs.
struct DeviceCall : gpu_test::DenseForwardCall<__nv_bfloat16> {
  using DenseForwardCall::DenseForwardCall;

  static void upload(DeviceArray<__nv_bfloat16>& dst, const std::vector<float>& x) {
    std::vector<__nv_bfloat16> h(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) h[i] = __float2bfloat16_rn(x[i]);
    dst.upload(h);
  }

  std::vector<float> output() const {
    const auto h = o.download();
    std::vector<float> out(h.size());
    for (std::size_t i = 0; i < h.size(); ++i) out[i] = __bfloat162float(h[i]);
    return out;
  }
};

std::size_t count_nan(const std::vector<float>& x) {
  std::size_t n = 0;
  for (float e : x) n += std::isnan(e) ? 1 : 0;
  return n;
}

struct DeviceCase {
  Recipe recipe;
  MaskKind mask;
  bool smooth_k;
  bool direct_p;
};

class GpuForwardDevice : public ::testing::TestWithParam<DeviceCase> {};

TEST_P(GpuForwardDevice, MatchesTheHostEntryPoint) {
  FP4ATTN_REQUIRE_HOPPER();
  const DeviceCase c = GetParam();
  const AttentionShape s{2, 4, 2, 300, 333, 128};
  std::mt19937 rng(gpu_test::fresh_seed());
  const auto q = gpu_test::attention_input(s.q_elems(), s.D, 0.5f, rng);
  const auto k = gpu_test::attention_input(s.kv_elems(), s.D, 3.0f, rng);
  const auto v = gpu_test::attention_input(s.kv_elems(), s.D, 1.0f, rng);
  AttentionOptions opt;
  opt.recipe = c.recipe;
  opt.mask = c.mask;
  opt.smooth_k = c.smooth_k;
  opt.direct_p = c.direct_p;
  DeviceCall call(s, c.recipe);
  DeviceCall::upload(call.q, q);
  DeviceCall::upload(call.k, k);
  DeviceCall::upload(call.v, v);
  call.run(opt);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);

  // Same quantizers, same fold, same kernel: the host entry point gives the same bits.
  const ForwardOutput want = forward(s, q, k, v, opt, Executor::sm90);
  const auto o = call.output();
  const auto lse = call.lse.download();
  EXPECT_EQ(count_nan(o), 0u);
  EXPECT_EQ(compare(o, want.o).max_abs, 0.0);
  for (std::size_t i = 0; i < lse.size(); ++i) ASSERT_EQ(lse[i], want.lse[i]) << "LSE row " << i;
}

INSTANTIATE_TEST_SUITE_P(Recipes, GpuForwardDevice,
                         ::testing::Values(DeviceCase{Recipe::fp8, MaskKind::causal, true, true},
                                           DeviceCase{Recipe::mxfp4_train, MaskKind::causal, true, true},
                                           DeviceCase{Recipe::mxfp4_train, MaskKind::none, false, false},
                                           DeviceCase{Recipe::mxfp4, MaskKind::none, true, true},
                                           DeviceCase{Recipe::mxfp4, MaskKind::causal, false, true},
                                           DeviceCase{Recipe::nvfp4, MaskKind::causal, true, false}),
                         [](const ::testing::TestParamInfo<DeviceCase>& info) {
                           const DeviceCase& c = info.param;
                           return std::string(to_string(c.recipe)) +
                                  (c.mask == MaskKind::causal ? "_causal" : "_full") +
                                  (c.smooth_k ? "_smoothk" : "") + (c.direct_p ? "_directp" : "_exp2");
                         });

class GpuForwardDeviceNonFinite : public ::testing::TestWithParam<Recipe> {};

TEST_P(GpuForwardDeviceNonFinite, MakesEveryOutputNan) {
  FP4ATTN_REQUIRE_HOPPER();
  const AttentionShape s{1, 2, 2, 200, 200, 64};
  std::mt19937 rng(gpu_test::fresh_seed());
  const auto q = gpu_test::attention_input(s.q_elems(), s.D, 0.5f, rng);
  const auto k = gpu_test::attention_input(s.kv_elems(), s.D, 1.0f, rng);
  const auto v = gpu_test::attention_input(s.kv_elems(), s.D, 1.0f, rng);
  AttentionOptions opt;
  opt.recipe = GetParam();
  opt.smooth_k = true;
  DeviceCall call(s, opt.recipe);

  struct Bad {
    const char* tensor;
    float value;
  };
  for (const Bad bad : {Bad{"q", NAN}, Bad{"k", INFINITY}, Bad{"v", -INFINITY}}) {
    SCOPED_TRACE(std::string(bad.tensor) + " holds " + std::to_string(bad.value));
    auto bq = q, bk = k, bv = v;
    auto& target = bad.tensor[0] == 'q' ? bq : bad.tensor[0] == 'k' ? bk : bv;
    target[target.size() / 3] = bad.value;
    DeviceCall::upload(call.q, bq);
    DeviceCall::upload(call.k, bk);
    DeviceCall::upload(call.v, bv);
    call.run(opt);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const auto o = call.output();
    const auto lse = call.lse.download();
    EXPECT_EQ(count_nan(o), o.size());
    EXPECT_EQ(count_nan(lse), lse.size());
  }

  // The same workspace on clean input: the flags of the last call are cleared.
  DeviceCall::upload(call.q, q);
  DeviceCall::upload(call.k, k);
  DeviceCall::upload(call.v, v);
  call.run(opt);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(count_nan(call.output()), 0u);
  EXPECT_EQ(count_nan(call.lse.download()), 0u);
}

INSTANTIATE_TEST_SUITE_P(Recipes, GpuForwardDeviceNonFinite,
                         ::testing::Values(Recipe::fp8, Recipe::mxfp4_train, Recipe::mxfp4),
                         [](const ::testing::TestParamInfo<Recipe>& info) { return std::string(to_string(info.param)); });

TEST(GpuForwardDeviceErrors, NamesTheWorkspaceWhenItFitsAnotherRecipe) {
  FP4ATTN_REQUIRE_HOPPER();
  // The MX recipes need their MXFP4 codes and folded operands on top of what fp8 needs.
  const AttentionShape s{1, 2, 2, 128, 128, 64};
  ASSERT_GT(dispatch::sm90_device_workspace_bytes(s, Recipe::mxfp4), dispatch::sm90_device_workspace_bytes(s));
  DeviceCall call(s, Recipe::fp8);
  AttentionOptions opt;
  opt.recipe = Recipe::mxfp4;
  try {
    call.run(opt);
    FAIL() << "an fp8-sized workspace was accepted for recipe mxfp4";
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), "workspace");
  }
}

}  // namespace
}  // namespace fp4attn
