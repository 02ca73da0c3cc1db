// GPU suite of the zero-copy forward (dispatch::sm90_forward_device, what the
// PyTorch layer's CUDA path calls): it agrees with the host entry point on
// the same bf16 inputs, and non-finite input, which it cannot report without
// a host synchronisation, makes every output NaN instead of plausible numbers.
#include <cmath>
#include <string>
#include <vector>

#include "dispatch/sm90_executor.hpp"
#include "fp4attn/attention.hpp"
#include "fp4attn/error.hpp"
#include "fp4attn/metrics.hpp"
#include "gpu/gpu_test_util.hpp"

namespace fp4attn {
namespace {

using gpu_test::DeviceArray;

// One device call on bf16 (B, S, H, D) tensors, its workspace and outputs.
struct DeviceCall {
  AttentionShape shape;
  DeviceArray<__nv_bfloat16> q, k, v, o;
  DeviceArray<float> lse;
  DeviceArray<unsigned char> workspace;

  explicit DeviceCall(const AttentionShape& s)
      : shape(s),
        q(static_cast<std::size_t>(s.q_elems())),
        k(static_cast<std::size_t>(s.kv_elems())),
        v(static_cast<std::size_t>(s.kv_elems())),
        o(static_cast<std::size_t>(s.q_elems())),
        lse(static_cast<std::size_t>(s.lse_elems())),
        workspace(dispatch::sm90_device_workspace_bytes(s)) {}

  static void upload(DeviceArray<__nv_bfloat16>& dst, const std::vector<float>& x) {
    std::vector<__nv_bfloat16> h(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) h[i] = __float2bfloat16_rn(x[i]);
    dst.upload(h);
  }

  // Contiguous (B, S, H, D) element strides.
  static dispatch::DeviceTensorView view(const DeviceArray<__nv_bfloat16>& x, std::int64_t S, std::int64_t H,
                                         std::int64_t D) {
    return {x.ptr, S * H * D, H * D, D};
  }

  void run(const AttentionOptions& opt) {
    const AttentionShape& s = shape;
    dispatch::DeviceForwardArgs a;
    a.shape = s;
    a.element = dispatch::DeviceElement::bf16;
    a.q = view(q, s.Sq, s.Hq, s.D);
    a.k = view(k, s.Sk, s.Hkv, s.D);
    a.v = view(v, s.Sk, s.Hkv, s.D);
    a.o = o.ptr;
    a.o_stride_b = s.Sq * s.Hq * s.D, a.o_stride_s = s.Hq * s.D, a.o_stride_h = s.D;
    a.lse = lse.ptr;
    a.workspace = workspace.ptr;
    a.workspace_bytes = workspace.bytes();
    o.poison();
    lse.poison();
    dispatch::sm90_forward_device(a, opt, nullptr);
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

TEST(GpuForwardDevice, MatchesTheHostEntryPoint) {
  FP4ATTN_REQUIRE_HOPPER();
  const AttentionShape s{2, 4, 2, 300, 333, 128};
  std::mt19937 rng(gpu_test::fresh_seed());
  const auto q = gpu_test::attention_input(s.q_elems(), s.D, 0.5f, rng);
  const auto k = gpu_test::attention_input(s.kv_elems(), s.D, 3.0f, rng);
  const auto v = gpu_test::attention_input(s.kv_elems(), s.D, 1.0f, rng);
  AttentionOptions opt;
  opt.mask = MaskKind::causal;
  DeviceCall call(s);
  DeviceCall::upload(call.q, q);
  DeviceCall::upload(call.k, k);
  DeviceCall::upload(call.v, v);
  call.run(opt);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);

  // Same quantizer, same kernel: the host entry point gives the same bits.
  const ForwardOutput want = forward(s, q, k, v, opt, Executor::sm90);
  const auto o = call.output();
  const auto lse = call.lse.download();
  EXPECT_EQ(count_nan(o), 0u);
  EXPECT_EQ(compare(o, want.o).max_abs, 0.0);
  for (std::size_t i = 0; i < lse.size(); ++i) ASSERT_EQ(lse[i], want.lse[i]) << "LSE row " << i;
}

TEST(GpuForwardDevice, NonFiniteInputMakesEveryOutputNan) {
  FP4ATTN_REQUIRE_HOPPER();
  const AttentionShape s{1, 2, 2, 200, 200, 64};
  std::mt19937 rng(gpu_test::fresh_seed());
  const auto q = gpu_test::attention_input(s.q_elems(), s.D, 0.5f, rng);
  const auto k = gpu_test::attention_input(s.kv_elems(), s.D, 1.0f, rng);
  const auto v = gpu_test::attention_input(s.kv_elems(), s.D, 1.0f, rng);
  AttentionOptions opt;
  DeviceCall call(s);

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

TEST(GpuForwardDevice, RefusesTheMxRecipesByName) {
  FP4ATTN_REQUIRE_HOPPER();
  const AttentionShape s{1, 2, 2, 128, 128, 64};
  DeviceCall call(s);
  AttentionOptions opt;
  opt.recipe = Recipe::mxfp4;  // the sm90 executor runs it, but through the host entry point only
  try {
    call.run(opt);
    FAIL() << "the zero-copy path accepted recipe mxfp4";
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), "recipe");
  }
}

}  // namespace
}  // namespace fp4attn
