// GPU suite of packed sequences (DeviceForwardArgs::cu_seqlens_q / _k,
// FlashAttention's varlen batches) on the zero-copy forward: one call over
// every sequence gives each sequence the bits of a call on it alone, O and
// LSE, for lengths on and off the 128-token tiles, sequences whose queries
// outnumber their keys (causal rows that see no key), GQA, smooth_k and
// Direct-P on and off, and head dims read in place (64, 128, 72); cu_seqlens
// that do not fit the call give NaN outputs.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "cuda/common/packed_rows.hpp"
#include "dispatch/sm90_executor.hpp"
#include "fp4attn/attention.hpp"
#include "fp4attn/error.hpp"
#include "gpu/device_forward_args.hpp"
#include "gpu/gpu_test_util.hpp"
#include "gpu/packed_batch.hpp"

namespace fp4attn {
namespace {

using gpu_test::bits;
using gpu_test::DeviceArray;
using gpu_test::named_argument;
using gpu_test::to_bf16;

struct PackedCase {
  std::int64_t D;
  MaskKind mask;
  bool smooth_k;
  bool direct_p;
};

class GpuForwardPacked : public ::testing::TestWithParam<PackedCase> {};

TEST_P(GpuForwardPacked, EachSequenceIsItsOwnCall) {
  FP4ATTN_REQUIRE_HOPPER();
  const PackedCase c = GetParam();
  const gpu_test::PackedBatch batch;
  const auto& [lens_q, lens_k, cu_q, cu_k, n, max_q, max_k, total_q, total_k] = batch;
  const std::int64_t Hq = 4, Hkv = 2, D = c.D;
  const std::uint32_t seed = gpu_test::fresh_seed();
  std::mt19937 rng(seed);
  const auto [q, k, v] = gpu_test::packed_inputs(batch, Hq, Hkv, D, rng);
  AttentionOptions opt;
  opt.mask = c.mask;
  opt.smooth_k = c.smooth_k;
  opt.direct_p = c.direct_p;

  // One call over the packed tensors.
  const AttentionShape packed_shape = batch.shape(Hq, Hkv, D);
  DeviceArray<__nv_bfloat16> dq(q.size()), dk(k.size()), dv(v.size()), o(q.size());
  DeviceArray<float> lse(static_cast<std::size_t>(Hq * total_q));
  DeviceArray<int> dcu_q(cu_q.size()), dcu_k(cu_k.size());
  DeviceArray<unsigned char> workspace(
      dispatch::sm90_device_workspace_bytes(packed_shape, Recipe::fp8, batch.tokens()));
  dq.upload(q), dk.upload(k), dv.upload(v), dcu_q.upload(cu_q), dcu_k.upload(cu_k);
  o.poison(), lse.poison(), workspace.poison();
  const dispatch::DeviceForwardArgs a = gpu_test::packed_forward_args(
      batch, packed_shape, dq.ptr, dk.ptr, dv.ptr, o.ptr, lse.ptr, workspace.ptr, workspace.bytes(), dcu_q.ptr,
      dcu_k.ptr);
  dispatch::sm90_forward_device(a, opt, nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << "seed " << seed;
  const auto o_packed = o.download();
  const auto lse_packed = lse.download();

  // Each sequence alone, dense (1, L, H, D).
  for (std::int64_t b = 0; b < n; ++b) {
    const AttentionShape s{1, Hq, Hkv, lens_q[b], lens_k[b], D};
    gpu_test::DenseForwardCall<__nv_bfloat16> one(s, Recipe::fp8);
    const auto slice = [](const std::vector<__nv_bfloat16>& x, std::int64_t first, std::int64_t rows, std::int64_t w) {
      return std::vector<__nv_bfloat16>(x.begin() + first * w, x.begin() + (first + rows) * w);
    };
    one.q.upload(slice(q, cu_q[b], lens_q[b], Hq * D));
    one.k.upload(slice(k, cu_k[b], lens_k[b], Hkv * D));
    one.v.upload(slice(v, cu_k[b], lens_k[b], Hkv * D));
    one.run(opt);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << "seed " << seed;
    const auto o_one = one.o.download();
    const auto lse_one = one.lse.download();
    std::int64_t o_differ = 0, lse_differ = 0;
    for (std::int64_t i = 0; i < lens_q[b] * Hq * D; ++i)
      o_differ += bits(o_one[i]) != bits(o_packed[cu_q[b] * Hq * D + i]);
    for (std::int64_t h = 0; h < Hq; ++h)
      for (std::int64_t r = 0; r < lens_q[b]; ++r)
        lse_differ += bits(lse_one[h * lens_q[b] + r]) != bits(lse_packed[h * total_q + cu_q[b] + r]);
    EXPECT_EQ(o_differ, 0) << "sequence " << b << " (" << lens_q[b] << " queries, " << lens_k[b] << " keys), seed "
                           << seed;
    EXPECT_EQ(lse_differ, 0) << "sequence " << b << ", seed " << seed;
  }
}

std::string packed_name(const ::testing::TestParamInfo<PackedCase>& info) {
  const PackedCase& c = info.param;
  return "D" + std::to_string(c.D) + (c.mask == MaskKind::causal ? "_causal" : "_full") +
         (c.smooth_k ? "_smoothk" : "") + (c.direct_p ? "_directp" : "_exp2");
}

INSTANTIATE_TEST_SUITE_P(Packed, GpuForwardPacked,
                         ::testing::Values(PackedCase{128, MaskKind::none, true, true},
                                           PackedCase{128, MaskKind::causal, true, true},
                                           PackedCase{128, MaskKind::causal, false, false},
                                           PackedCase{64, MaskKind::none, false, true},
                                           PackedCase{64, MaskKind::causal, true, true},
                                           PackedCase{72, MaskKind::causal, true, true}),
                         packed_name);

// cu_seqlens are checked on the device against the call's sizes (the host
// need not read them: a CUDA graph replays a call with whatever they hold).
// A grid sized for longer sequences than the batch holds gives the same
// bits; offsets that do not fit the call give O and LSE NaN everywhere (the
// outputs start finite here, so an unwritten element fails) and touch no
// memory outside the call's tensors (the sanitizer stage runs this case).
TEST(GpuForwardPackedCheck, CuSeqlensThatDoNotFitGiveNaN) {
  FP4ATTN_REQUIRE_HOPPER();
  const gpu_test::PackedBatch batch;
  const std::int64_t Hq = 4, Hkv = 2, D = 64;
  const std::uint32_t seed = gpu_test::fresh_seed();
  std::mt19937 rng(seed);
  const auto [q, k, v] = gpu_test::packed_inputs(batch, Hq, Hkv, D, rng);
  DeviceArray<__nv_bfloat16> dq(q.size()), dk(k.size()), dv(v.size()), o(q.size());
  DeviceArray<float> lse(static_cast<std::size_t>(Hq * batch.total_q));
  DeviceArray<int> dcu_q(batch.cu_q.size()), dcu_k(batch.cu_k.size());
  dq.upload(q), dk.upload(k), dv.upload(v);
  AttentionOptions opt;
  opt.mask = MaskKind::causal;
  // Runs one call on cu_seqlens (cu_q, cu_k) with the shape's longest lengths
  // `longer` tokens beyond the batch's; O and LSE start at zero.
  const auto run = [&](const std::vector<int>& cu_q, const std::vector<int>& cu_k, std::int64_t longer) {
    AttentionShape shape = batch.shape(Hq, Hkv, D);
    shape.Sq += longer, shape.Sk += longer;
    DeviceArray<unsigned char> workspace(dispatch::sm90_device_workspace_bytes(shape, Recipe::fp8, batch.tokens()));
    workspace.poison();
    dcu_q.upload(cu_q), dcu_k.upload(cu_k);
    cudaMemset(o.ptr, 0, o.bytes()), cudaMemset(lse.ptr, 0, lse.bytes());
    const dispatch::DeviceForwardArgs a = gpu_test::packed_forward_args(
        batch, shape, dq.ptr, dk.ptr, dv.ptr, o.ptr, lse.ptr, workspace.ptr, workspace.bytes(), dcu_q.ptr, dcu_k.ptr);
    dispatch::sm90_forward_device(a, opt, nullptr);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess) << "seed " << seed;
    return std::pair{o.download(), lse.download()};
  };
  const auto [o_exact, lse_exact] = run(batch.cu_q, batch.cu_k, 0);
  const auto [o_wide, lse_wide] = run(batch.cu_q, batch.cu_k, 300);
  std::int64_t differ = 0, nan_o = 0;
  for (std::size_t i = 0; i < o_exact.size(); ++i) {
    differ += bits(o_exact[i]) != bits(o_wide[i]);
    nan_o += std::isnan(__bfloat162float(o_exact[i]));
  }
  for (std::size_t i = 0; i < lse_exact.size(); ++i) differ += bits(lse_exact[i]) != bits(lse_wide[i]);
  EXPECT_EQ(differ, 0) << "a grid for longer sequences changed the result, seed " << seed;
  EXPECT_EQ(nan_o, 0) << "valid cu_seqlens gave NaN, seed " << seed;

  const auto with = [](std::vector<int> cu, std::size_t at, int value) {
    cu[at] = value;
    return cu;
  };
  const std::vector<int>& cq = batch.cu_q;
  const std::vector<int>& ck = batch.cu_k;
  std::vector<int> one_long(cq.size(), 0);  // every query in the last sequence: longer than the grid's rows
  one_long.back() = cq.back();
  const std::vector<std::pair<std::string, std::pair<std::vector<int>, std::vector<int>>>> invalid = {
      {"cu_q starts at 1", {with(cq, 0, 1), ck}},
      {"cu_k decreases", {cq, with(ck, 2, ck[1] - 1)}},
      {"cu_q ends before total_q", {with(cq, cq.size() - 1, cq.back() - 1), ck}},
      {"cu_k ends past total_k", {cq, with(ck, ck.size() - 1, ck.back() + 128)}},
      {"a sequence longer than the grid", {one_long, ck}},
      {"a negative offset", {cq, with(ck, 1, -5)}},
  };
  for (const auto& [what, cus] : invalid) {
    const auto [o_bad, lse_bad] = run(cus.first, cus.second, 0);
    std::int64_t finite = 0;
    for (const auto x : o_bad) finite += !std::isnan(__bfloat162float(x));
    for (const float x : lse_bad) finite += !std::isnan(x);
    EXPECT_EQ(finite, 0) << what << ": " << finite << " output elements are not NaN, seed " << seed;
  }
}

// The host's bound of the tile-aligned layout (no device involved): every
// batch's rows, each sequence rounded up to 128 tokens, fit in
// packed_layout_rows(tokens, sequences), which overshoots by less than a
// tile per sequence plus one.
TEST(PackedLayoutRows, BoundsEveryBatch) {
  std::mt19937 rng(gpu_test::fresh_seed());
  for (int trial = 0; trial < 2000; ++trial) {
    const int n = 1 + static_cast<int>(rng() % 300);
    const std::int64_t most = trial % 2 == 0 ? 200 : 70000;
    std::int64_t tokens = 0, rows = 0;
    for (int b = 0; b < n; ++b) {
      const std::int64_t len = static_cast<std::int64_t>(rng() % (most + 1));  // empty sequences too
      tokens += len, rows += (len + 127) / 128 * 128;
    }
    const std::int64_t bound = cuda_common::packed_layout_rows(tokens, n);
    EXPECT_EQ(bound % 128, 0);
    EXPECT_GE(bound, rows) << n << " sequences, " << tokens << " tokens";
    EXPECT_LT(bound, rows + 128 * (n + 1)) << n << " sequences, " << tokens << " tokens";
  }
}

TEST(GpuForwardPackedErrors, NameTheArgument) {
  FP4ATTN_REQUIRE_HOPPER();
  const AttentionShape s{2, 2, 2, 128, 128, 64};
  DeviceArray<__nv_bfloat16> x(static_cast<std::size_t>(s.q_elems()));
  DeviceArray<float> lse(static_cast<std::size_t>(s.lse_elems()));
  DeviceArray<int> cu(3);
  cu.upload({0, 100, 256});
  DeviceArray<unsigned char> workspace(dispatch::sm90_device_workspace_bytes(s, Recipe::mxfp4));
  dispatch::DeviceForwardArgs a =
      gpu_test::dense_forward_args(s, x.ptr, x.ptr, x.ptr, x.ptr, lse.ptr, workspace.ptr, workspace.bytes());
  a.cu_seqlens_q = cu.ptr;  // without cu_seqlens_k
  a.lse_pitch = 256;
  AttentionOptions opt;
  const auto run = [&] { dispatch::sm90_forward_device(a, opt, nullptr); };
  EXPECT_EQ(named_argument(run), "cu_seqlens");
  a.cu_seqlens_k = cu.ptr;
  opt.recipe = Recipe::mxfp4;
  EXPECT_EQ(named_argument(run), "recipe");
  opt.recipe = Recipe::fp8;
  a.lse_pitch = 0;
  EXPECT_EQ(named_argument(run), "lse_pitch");
  a.lse_pitch = 256;  // k_tokens left 0
  EXPECT_EQ(named_argument(run), "k_tokens");
  // A workspace sized for the (B, longest) layout is not the packed layout's.
  a.k_tokens = 256;
  EXPECT_NE(dispatch::sm90_device_workspace_bytes(s, Recipe::fp8, {256, 256}),
            dispatch::sm90_device_workspace_bytes(s, Recipe::fp8));
  EXPECT_EQ(named_argument([&] {
              dispatch::DeviceForwardArgs small = a;
              small.workspace_bytes = dispatch::sm90_device_workspace_bytes(s, Recipe::fp8, {256, 256}) - 1;
              dispatch::sm90_forward_device(small, opt, nullptr);
            }),
            "workspace");
}

}  // namespace
}  // namespace fp4attn
