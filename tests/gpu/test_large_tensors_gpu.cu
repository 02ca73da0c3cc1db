// GPU suite of the zero-copy forward and backward on tensors of more than
// 2^31 elements: every offset into the inputs, the outputs, the quantized
// operands and their scales then needs 64 bits. Attention is independent per
// (batch, head), and every scale of the recipes is per (batch, head) or
// finer, except NVFP4's scale per tensor, which the test pins by planting
// each tensor's largest magnitude in both batches it checks. (Not with
// smooth_k: the largest |k − mean| would then depend on each batch's mean.)
// So batch b of the large call must equal, bit for bit, a call on batch b
// alone. The first and the last batch are checked: the last one's elements
// all lie past 2^31.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstring>
#include <ostream>
#include <string>
#include <vector>

#include "cuda/common/random_fill.hpp"
#include "dispatch/sm90_executor.hpp"
#include "fp4attn/attention.hpp"
#include "gpu/device_forward_args.hpp"
#include "gpu/gpu_test_util.hpp"

namespace fp4attn {
namespace {

using gpu_test::DeviceArray;
using Bf16Bits = std::uint16_t;

constexpr std::int64_t kTwoPow31 = std::int64_t{1} << 31;
constexpr Bf16Bits kPlantedBits = 0x4180;  // bf16 16.0: above every standard-normal sample the fill makes

struct LargeCase {
  Recipe recipe;
  MaskKind mask;
  std::int64_t D;
  bool smooth_k = true;
};

std::string name_of(const LargeCase& c) {
  return std::string(to_string(c.recipe)) + (c.mask == MaskKind::causal ? "_causal" : "_full") + "_D" +
         std::to_string(c.D) + (c.smooth_k ? "_smoothk" : "");
}
void PrintTo(const LargeCase& c, std::ostream* os) { *os << name_of(c); }

// bf16 (B, S, H, D) inputs, outputs and workspace of one device call, as raw bits.
using Call = gpu_test::DenseForwardCall<Bf16Bits>;

// Elements [first, first + count) of a device array.
template <class T>
std::vector<T> download_range(const DeviceArray<T>& x, std::int64_t first, std::int64_t count) {
  std::vector<T> h(static_cast<std::size_t>(count));
  EXPECT_EQ(cudaMemcpy(h.data(), x.ptr + first, h.size() * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
  return h;
}

template <class T>
void copy_range(DeviceArray<T>& dst, const DeviceArray<T>& src, std::int64_t first, std::int64_t count) {
  ASSERT_EQ(cudaMemcpy(dst.ptr, src.ptr + first, static_cast<std::size_t>(count) * sizeof(T), cudaMemcpyDeviceToDevice),
            cudaSuccess);
}

bool is_nan(float x) { return x != x; }
bool is_nan(Bf16Bits x) { return (x & 0x7FFFu) > 0x7F80u; }

// Elements of batch b of `large` (batch stride `per_batch`) that differ from
// `alone`'s, bit for bit; also counts NaN bit patterns (the poison of
// outputs never written) in `alone` as differences.
template <class T>
std::int64_t differing(const DeviceArray<T>& alone, const DeviceArray<T>& large, std::int64_t b, std::int64_t per_batch) {
  const auto want = alone.download();
  const auto got = download_range(large, b * per_batch, per_batch);
  std::int64_t n = 0;
  for (std::size_t i = 0; i < want.size(); ++i)
    n += std::memcmp(&want[i], &got[i], sizeof(T)) != 0 || is_nan(want[i]) ? 1 : 0;
  return n;
}

void plant(DeviceArray<Bf16Bits>& x, std::int64_t index) {
  ASSERT_EQ(cudaMemcpy(x.ptr + index, &kPlantedBits, sizeof(Bf16Bits), cudaMemcpyHostToDevice), cudaSuccess);
}

// Whether `bytes` fit the free device memory with 4 GiB to spare.
bool fits(std::size_t bytes) {
  std::size_t free_bytes = 0, total_bytes = 0;
  return cudaMemGetInfo(&free_bytes, &total_bytes) == cudaSuccess && bytes + (std::size_t{4} << 30) <= free_bytes;
}

class GpuForwardLarge : public ::testing::TestWithParam<LargeCase> {};

TEST_P(GpuForwardLarge, EachBatchEqualsACallOnItAlone) {
  FP4ATTN_REQUIRE_HOPPER();
  const LargeCase c = GetParam();
  // 8 query heads over 4 K/V heads (GQA); B chosen so that K and V, the
  // smaller tensors, pass 2^31 elements and the last batch lies beyond it.
  constexpr std::int64_t kS = 16384, kHq = 8, kHkv = 4;
  const std::int64_t kv_per_batch = kS * kHkv * c.D;
  const AttentionShape big{kTwoPow31 / kv_per_batch + 2, kHq, kHkv, kS, kS, c.D};
  ASSERT_GT(big.kv_elems(), kTwoPow31);
  ASSERT_GT((big.B - 1) * kv_per_batch, kTwoPow31);

  const std::size_t need = 2 * static_cast<std::size_t>(big.q_elems() + big.kv_elems()) * sizeof(Bf16Bits) +
                           dispatch::sm90_device_workspace_bytes(big, c.recipe);
  if (!fits(need)) GTEST_SKIP() << "needs " << (need >> 30) << " GiB of device memory";

  Call large(big, c.recipe);
  ASSERT_TRUE(large.allocated());
  const std::uint64_t seed = gpu_test::fresh_seed();
  cuda_common::fill_normal_bf16(large.q.ptr, big.q_elems(), seed, nullptr);
  cuda_common::fill_normal_bf16(large.k.ptr, big.kv_elems(), seed + 1, nullptr);
  cuda_common::fill_normal_bf16(large.v.ptr, big.kv_elems(), seed + 2, nullptr);
  const std::int64_t q_batch = kS * kHq * c.D, lse_batch = kHq * kS;
  const std::int64_t checked[2] = {0, big.B - 1};
  for (const std::int64_t b : checked) {
    // Somewhere inside the batch, a different place in each tensor.
    plant(large.q, b * q_batch + q_batch / 3);
    plant(large.k, b * kv_per_batch + kv_per_batch / 5);
    plant(large.v, b * kv_per_batch + kv_per_batch / 7);
  }

  AttentionOptions opt;
  opt.recipe = c.recipe;
  opt.mask = c.mask;
  opt.smooth_k = c.smooth_k;
  large.run(opt);
  FP4ATTN_CUDA_OK(cudaDeviceSynchronize());

  AttentionShape one = big;
  one.B = 1;
  Call alone(one, c.recipe);
  ASSERT_TRUE(alone.allocated());
  for (const std::int64_t b : checked) {
    SCOPED_TRACE("batch " + std::to_string(b) + " of " + std::to_string(big.B) + ", seed " + std::to_string(seed));
    copy_range(alone.q, large.q, b * q_batch, q_batch);
    copy_range(alone.k, large.k, b * kv_per_batch, kv_per_batch);
    copy_range(alone.v, large.v, b * kv_per_batch, kv_per_batch);
    alone.run(opt);
    FP4ATTN_CUDA_OK(cudaDeviceSynchronize());

    EXPECT_EQ(differing(alone.o, large.o, b, q_batch), 0) << "elements of O unlike the call on this batch alone";
    EXPECT_EQ(differing(alone.lse, large.lse, b, lse_batch), 0) << "LSE rows unlike the call on this batch alone";
  }
}

INSTANTIATE_TEST_SUITE_P(Recipes, GpuForwardLarge,
                         ::testing::Values(LargeCase{Recipe::fp8, MaskKind::none, 128},
                                           LargeCase{Recipe::fp8, MaskKind::causal, 64},
                                           LargeCase{Recipe::mxfp4_train, MaskKind::causal, 128},
                                           LargeCase{Recipe::mxfp4, MaskKind::none, 128},
                                           LargeCase{Recipe::nvfp4, MaskKind::none, 128, false}),
                         [](const ::testing::TestParamInfo<LargeCase>& info) { return name_of(info.param); });

// The backward (deterministic, its default) on the forward's outputs: dQ, dK
// and dV of batch b equal a backward on batch b alone. No NVFP4 here: the
// backward runs recipes fp8 and mxfp4_train, whose scales are all per
// (batch, head) or finer.
class GpuBackwardLarge : public ::testing::TestWithParam<LargeCase> {};

TEST_P(GpuBackwardLarge, EachBatchEqualsACallOnItAlone) {
  FP4ATTN_REQUIRE_HOPPER();
  const LargeCase c = GetParam();
  constexpr std::int64_t kS = 16384, kH = 4;
  const std::int64_t per_batch = kS * kH * c.D;  // every tensor's, Hq = Hkv
  const AttentionShape big{kTwoPow31 / per_batch + 2, kH, kH, kS, kS, c.D};
  ASSERT_GT((big.B - 1) * per_batch, kTwoPow31);
  const std::size_t need = 8 * static_cast<std::size_t>(big.q_elems()) * sizeof(Bf16Bits) +
                           dispatch::sm90_device_workspace_bytes(big, c.recipe) +
                           dispatch::sm90_device_backward_workspace_bytes(big, true, c.recipe);
  if (!fits(need)) GTEST_SKIP() << "needs " << (need >> 30) << " GiB of device memory";

  AttentionOptions opt;
  opt.recipe = c.recipe;
  opt.mask = c.mask;
  opt.smooth_k = c.smooth_k;

  // Q, K, V, O, LSE, dO, dQ, dK, dV and a workspace; the forward's outputs
  // are made here by the forward.
  struct Backward {
    Call fwd;
    DeviceArray<Bf16Bits> d_o, dq, dk, dv;
    DeviceArray<unsigned char> workspace;
    Backward(const AttentionShape& s, Recipe recipe)
        : fwd(s, recipe),
          d_o(static_cast<std::size_t>(s.q_elems())),
          dq(static_cast<std::size_t>(s.q_elems())),
          dk(static_cast<std::size_t>(s.kv_elems())),
          dv(static_cast<std::size_t>(s.kv_elems())),
          workspace(dispatch::sm90_device_backward_workspace_bytes(s, true, recipe)) {}
    bool allocated() const {
      return fwd.allocated() && d_o.ptr != nullptr && dq.ptr != nullptr && dk.ptr != nullptr && dv.ptr != nullptr &&
             workspace.ptr != nullptr;
    }
    void run(const AttentionOptions& opt) {
      const AttentionShape& s = fwd.shape;
      const std::int64_t sb = s.Sq * s.Hq * s.D, ss = s.Hq * s.D;  // Hq = Hkv, Sq = Sk: one layout for all
      dispatch::DeviceBackwardArgs a;
      a.shape = s;
      a.element = dispatch::DeviceElement::bf16;
      a.q = gpu_test::bshd_view(fwd.q.ptr, s.Sq, s.Hq, s.D);
      a.k = gpu_test::bshd_view(fwd.k.ptr, s.Sk, s.Hkv, s.D);
      a.v = gpu_test::bshd_view(fwd.v.ptr, s.Sk, s.Hkv, s.D);
      a.o = gpu_test::bshd_view(fwd.o.ptr, s.Sq, s.Hq, s.D);
      a.d_o = gpu_test::bshd_view(d_o.ptr, s.Sq, s.Hq, s.D);
      a.lse = fwd.lse.ptr;
      a.dq = dq.ptr, a.dq_stride_b = sb, a.dq_stride_s = ss, a.dq_stride_h = s.D;
      a.dk = dk.ptr, a.dk_stride_b = sb, a.dk_stride_s = ss, a.dk_stride_h = s.D;
      a.dv = dv.ptr, a.dv_stride_b = sb, a.dv_stride_s = ss, a.dv_stride_h = s.D;
      a.workspace = workspace.ptr;
      a.workspace_bytes = workspace.bytes();
      dq.poison();
      dk.poison();
      dv.poison();
      dispatch::sm90_backward_device(a, opt, true, nullptr);
    }
  };

  Backward large(big, c.recipe);
  ASSERT_TRUE(large.allocated());
  const std::uint64_t seed = gpu_test::fresh_seed();
  cuda_common::fill_normal_bf16(large.fwd.q.ptr, big.q_elems(), seed, nullptr);
  cuda_common::fill_normal_bf16(large.fwd.k.ptr, big.kv_elems(), seed + 1, nullptr);
  cuda_common::fill_normal_bf16(large.fwd.v.ptr, big.kv_elems(), seed + 2, nullptr);
  cuda_common::fill_normal_bf16(large.d_o.ptr, big.q_elems(), seed + 3, nullptr);
  large.fwd.run(opt);
  large.run(opt);
  FP4ATTN_CUDA_OK(cudaDeviceSynchronize());

  AttentionShape one = big;
  one.B = 1;
  Backward alone(one, c.recipe);
  ASSERT_TRUE(alone.allocated());
  for (const std::int64_t b : {std::int64_t{0}, big.B - 1}) {
    SCOPED_TRACE("batch " + std::to_string(b) + " of " + std::to_string(big.B) + ", seed " + std::to_string(seed));
    copy_range(alone.fwd.q, large.fwd.q, b * per_batch, per_batch);
    copy_range(alone.fwd.k, large.fwd.k, b * per_batch, per_batch);
    copy_range(alone.fwd.v, large.fwd.v, b * per_batch, per_batch);
    copy_range(alone.fwd.o, large.fwd.o, b * per_batch, per_batch);
    copy_range(alone.fwd.lse, large.fwd.lse, b * kH * kS, kH * kS);
    copy_range(alone.d_o, large.d_o, b * per_batch, per_batch);
    alone.run(opt);
    FP4ATTN_CUDA_OK(cudaDeviceSynchronize());
    EXPECT_EQ(differing(alone.dq, large.dq, b, per_batch), 0) << "elements of dQ unlike the call on this batch alone";
    EXPECT_EQ(differing(alone.dk, large.dk, b, per_batch), 0) << "elements of dK unlike the call on this batch alone";
    EXPECT_EQ(differing(alone.dv, large.dv, b, per_batch), 0) << "elements of dV unlike the call on this batch alone";
  }
}

INSTANTIATE_TEST_SUITE_P(Recipes, GpuBackwardLarge,
                         ::testing::Values(LargeCase{Recipe::fp8, MaskKind::causal, 128},
                                           LargeCase{Recipe::mxfp4_train, MaskKind::none, 64}),
                         [](const ::testing::TestParamInfo<LargeCase>& info) { return name_of(info.param); });

}  // namespace
}  // namespace fp4attn
