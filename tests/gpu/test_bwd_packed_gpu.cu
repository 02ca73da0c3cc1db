// GPU suite of packed sequences (DeviceBackwardArgs::cu_seqlens_q / _k,
// FlashAttention's varlen batches) on the zero-copy backward: one call over
// every sequence gives each sequence the gradients of a call on it alone,
// bit for bit in the deterministic mode (dK and dV also in the one pass,
// whose dQ sums in a varying order), for lengths on and off the 128-token
// tiles, sequences whose queries outnumber their keys (causal rows that see
// no key), GQA, smooth_k and Direct-P on and off, both head dims, with and
// without the operands the packed forward keeps; cu_seqlens that do not fit
// the call give NaN gradients. Outputs start as NaN, so every row must be
// written.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

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
using Bf16 = __nv_bfloat16;

// The one pass's dQ against a call on the sequence alone: the same terms
// summed in another order, rounded to bf16 (one ulp is 2^-8 relative).
constexpr double kOnePassMaxRelL2 = 2e-3;

struct PackedCase {
  std::int64_t D;
  MaskKind mask;
  bool smooth_k;
  bool direct_p;
  bool deterministic;
  bool kept = false;  // the packed forward keeps Q's and K's operands for the packed backward
};

// Rows first .. first + rows − 1 of a (rows, width) matrix.
template <class T>
std::vector<T> rows_of(const std::vector<T>& x, std::int64_t first, std::int64_t rows, std::int64_t width) {
  return std::vector<T>(x.begin() + first * width, x.begin() + (first + rows) * width);
}

// Device tensors of one backward call (bf16, tokens × heads × D with the
// batch stride of a dense (B, S, H, D) tensor, or 0 for packed rows).
struct BackwardCall {
  AttentionShape shape;
  std::int64_t q_rows, k_rows;  // token rows of q and of k (B · S, or the packed totals)
  DeviceArray<Bf16> q, k, v, o, d_o, dq, dk, dv;
  DeviceArray<float> lse;

  BackwardCall(const AttentionShape& s, std::int64_t q_tokens, std::int64_t k_tokens)
      : shape(s), q_rows(q_tokens), k_rows(k_tokens),
        q(static_cast<std::size_t>(q_tokens * s.Hq * s.D)), k(static_cast<std::size_t>(k_tokens * s.Hkv * s.D)),
        v(k.count), o(q.count), d_o(q.count), dq(q.count), dk(k.count), dv(k.count),
        lse(static_cast<std::size_t>(q_tokens * s.Hq)) {}

  // Enqueues the backward on poisoned gradients and waits; packed: cu_seqlens on the
  // device; kept: what the forward kept (q and k are then not read).
  // finite_start: the gradients start at zero instead (a test that expects NaN).
  void run(const AttentionOptions& opt, bool deterministic, const int* cu_q = nullptr, const int* cu_k = nullptr,
           const DeviceArray<unsigned char>* kept = nullptr, bool finite_start = false) {
    const AttentionShape& s = shape;
    const bool packed = cu_q != nullptr;
    const std::int64_t q_batch = packed ? 0 : s.Sq * s.Hq * s.D, k_batch = packed ? 0 : s.Sk * s.Hkv * s.D;
    dispatch::DeviceBackwardArgs a;
    a.shape = s;
    a.element = dispatch::DeviceElement::bf16;
    a.q = {q.ptr, q_batch, s.Hq * s.D, s.D};
    a.k = {k.ptr, k_batch, s.Hkv * s.D, s.D};
    a.v = {v.ptr, k_batch, s.Hkv * s.D, s.D};
    a.o = {o.ptr, q_batch, s.Hq * s.D, s.D};
    a.d_o = {d_o.ptr, q_batch, s.Hq * s.D, s.D};
    a.lse = lse.ptr;
    a.dq = dq.ptr, a.dq_stride_b = q_batch, a.dq_stride_s = s.Hq * s.D, a.dq_stride_h = s.D;
    a.dk = dk.ptr, a.dk_stride_b = k_batch, a.dk_stride_s = s.Hkv * s.D, a.dk_stride_h = s.D;
    a.dv = dv.ptr, a.dv_stride_b = k_batch, a.dv_stride_s = s.Hkv * s.D, a.dv_stride_h = s.D;
    const dispatch::PackedTokens tokens = packed ? dispatch::PackedTokens{q_rows, k_rows} : dispatch::PackedTokens{};
    DeviceArray<unsigned char> workspace(
        dispatch::sm90_device_backward_workspace_bytes(s, deterministic, Recipe::fp8, kept != nullptr, tokens));
    workspace.poison();
    a.workspace = workspace.ptr, a.workspace_bytes = workspace.bytes();
    a.cu_seqlens_q = cu_q, a.cu_seqlens_k = cu_k, a.lse_pitch = tokens.q, a.k_tokens = tokens.k;
    if (kept != nullptr) a.saved = kept->ptr, a.saved_bytes = kept->bytes();
    dq.poison(), dk.poison(), dv.poison();
    if (finite_start) cudaMemset(dq.ptr, 0, dq.bytes()), cudaMemset(dk.ptr, 0, dk.bytes()), cudaMemset(dv.ptr, 0, dv.bytes());
    dispatch::sm90_backward_device(a, opt, deterministic, nullptr);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << cudaGetErrorString(cudaGetLastError());
  }
};

class GpuBackwardPacked : public ::testing::TestWithParam<PackedCase> {};

TEST_P(GpuBackwardPacked, EachSequenceIsItsOwnCall) {
  FP4ATTN_REQUIRE_HOPPER();
  const PackedCase c = GetParam();
  const gpu_test::PackedBatch batch;
  const auto& [lens_q, lens_k, cu_q, cu_k, n, max_q, max_k, total_q, total_k] = batch;
  const std::int64_t Hq = 4, Hkv = 2, D = c.D;
  const std::uint32_t seed = gpu_test::fresh_seed();
  std::mt19937 rng(seed);
  const auto [q, k, v] = gpu_test::packed_inputs(batch, Hq, Hkv, D, rng);
  const auto d_o = to_bf16(gpu_test::attention_input(static_cast<std::size_t>(total_q * Hq * D), D, 0.1f, rng));
  AttentionOptions opt;
  opt.mask = c.mask;
  opt.smooth_k = c.smooth_k;
  opt.direct_p = c.direct_p;

  // The packed forward gives O and the (Hq, total_q) LSE, each sequence's
  // those of its own call (test_fwd_packed_gpu.cu).
  const AttentionShape packed_shape = batch.shape(Hq, Hkv, D);
  BackwardCall packed(packed_shape, total_q, total_k);
  DeviceArray<int> dcu_q(cu_q.size()), dcu_k(cu_k.size());
  dcu_q.upload(cu_q), dcu_k.upload(cu_k);
  packed.q.upload(q), packed.k.upload(k), packed.v.upload(v), packed.d_o.upload(d_o);
  DeviceArray<unsigned char> kept(
      c.kept ? dispatch::sm90_device_saved_bytes(packed_shape, Recipe::fp8, batch.tokens()) : 0);
  kept.poison();
  {
    DeviceArray<unsigned char> workspace(
        dispatch::sm90_device_workspace_bytes(packed_shape, Recipe::fp8, batch.tokens()));
    workspace.poison();
    dispatch::DeviceForwardArgs a =
        gpu_test::packed_forward_args(batch, packed_shape, packed.q.ptr, packed.k.ptr, packed.v.ptr, packed.o.ptr,
                                      packed.lse.ptr, workspace.ptr, workspace.bytes(), dcu_q.ptr, dcu_k.ptr);
    if (c.kept) a.saved = kept.ptr, a.saved_bytes = kept.bytes();
    packed.o.poison(), packed.lse.poison();
    dispatch::sm90_forward_device(a, opt, nullptr);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << "seed " << seed;
  }
  const auto o = packed.o.download();
  const auto lse = packed.lse.download();
  if (c.kept) {
    // The backward takes Q and K from the kept block only: poisoned inputs would show otherwise.
    packed.q.poison(), packed.k.poison();
  }
  packed.run(opt, c.deterministic, dcu_q.ptr, dcu_k.ptr, c.kept ? &kept : nullptr);
  const auto dq_packed = packed.dq.download(), dk_packed = packed.dk.download(), dv_packed = packed.dv.download();

  for (std::int64_t b = 0; b < n; ++b) {
    const std::int64_t lq = lens_q[b], lk = lens_k[b];
    BackwardCall one(AttentionShape{1, Hq, Hkv, lq, lk, D}, lq, lk);
    one.q.upload(rows_of(q, cu_q[b], lq, Hq * D)), one.o.upload(rows_of(o, cu_q[b], lq, Hq * D));
    one.d_o.upload(rows_of(d_o, cu_q[b], lq, Hq * D));
    one.k.upload(rows_of(k, cu_k[b], lk, Hkv * D)), one.v.upload(rows_of(v, cu_k[b], lk, Hkv * D));
    std::vector<float> one_lse(static_cast<std::size_t>(Hq * lq));
    for (std::int64_t h = 0; h < Hq; ++h)
      for (std::int64_t r = 0; r < lq; ++r) one_lse[h * lq + r] = lse[h * total_q + cu_q[b] + r];
    one.lse.upload(one_lse);
    one.run(opt, c.deterministic);
    const std::string where = "sequence " + std::to_string(b) + " (" + std::to_string(lq) + " queries, " +
                              std::to_string(lk) + " keys), seed " + std::to_string(seed);
    const auto count_differ = [](const std::vector<Bf16>& mine, const std::vector<Bf16>& all, std::int64_t first) {
      std::int64_t differ = 0;
      for (std::size_t i = 0; i < mine.size(); ++i) differ += bits(mine[i]) != bits(all[first + i]);
      return differ;
    };
    EXPECT_EQ(count_differ(one.dk.download(), dk_packed, cu_k[b] * Hkv * D), 0) << "dK, " << where;
    EXPECT_EQ(count_differ(one.dv.download(), dv_packed, cu_k[b] * Hkv * D), 0) << "dV, " << where;
    const auto dq_one = one.dq.download();
    if (c.deterministic) {
      EXPECT_EQ(count_differ(dq_one, dq_packed, cu_q[b] * Hq * D), 0) << "dQ, " << where;
    } else {
      double diff = 0.0, norm = 0.0;
      bool finite = true;
      for (std::size_t i = 0; i < dq_one.size(); ++i) {
        const double x = __bfloat162float(dq_one[i]), y = __bfloat162float(dq_packed[cu_q[b] * Hq * D + i]);
        finite = finite && std::isfinite(x) && std::isfinite(y);
        diff += (x - y) * (x - y), norm += x * x;
      }
      EXPECT_TRUE(finite) << "dQ, " << where;
      EXPECT_LE(std::sqrt(diff), kOnePassMaxRelL2 * std::sqrt(norm)) << "dQ, " << where;
    }
  }
}

std::string packed_name(const ::testing::TestParamInfo<PackedCase>& info) {
  const PackedCase& c = info.param;
  return "D" + std::to_string(c.D) + (c.mask == MaskKind::causal ? "_causal" : "_full") +
         (c.smooth_k ? "_smoothk" : "") + (c.direct_p ? "_directp" : "_exp2") +
         (c.deterministic ? "" : "_onepass") + (c.kept ? "_kept" : "");
}

INSTANTIATE_TEST_SUITE_P(Packed, GpuBackwardPacked,
                         ::testing::Values(PackedCase{128, MaskKind::none, true, true, true},
                                           PackedCase{128, MaskKind::causal, true, true, true},
                                           PackedCase{128, MaskKind::causal, false, false, true},
                                           PackedCase{64, MaskKind::none, false, true, true},
                                           PackedCase{64, MaskKind::causal, true, true, true},
                                           PackedCase{64, MaskKind::causal, true, true, false},
                                           PackedCase{128, MaskKind::none, false, true, false},
                                           PackedCase{128, MaskKind::causal, true, true, true, true},
                                           PackedCase{64, MaskKind::none, false, false, true, true}),
                         packed_name);

// cu_seqlens that do not fit the call (checked on the device, as in the
// forward: test_fwd_packed_gpu.cu) give NaN gradients everywhere, in both
// modes; the gradients start at zero, so an unwritten element fails.
TEST(GpuBackwardPackedCheck, CuSeqlensThatDoNotFitGiveNaN) {
  FP4ATTN_REQUIRE_HOPPER();
  const gpu_test::PackedBatch batch;
  const std::int64_t Hq = 4, Hkv = 2, D = 64;
  const std::uint32_t seed = gpu_test::fresh_seed();
  std::mt19937 rng(seed);
  const auto [q, k, v] = gpu_test::packed_inputs(batch, Hq, Hkv, D, rng);
  const auto d_o = to_bf16(gpu_test::attention_input(q.size(), D, 0.1f, rng));
  BackwardCall call(batch.shape(Hq, Hkv, D), batch.total_q, batch.total_k);
  call.q.upload(q), call.k.upload(k), call.v.upload(v), call.o.upload(d_o), call.d_o.upload(d_o);
  cudaMemset(call.lse.ptr, 0, call.lse.bytes());
  std::vector<int> cu_k = batch.cu_k;
  cu_k[2] = cu_k[1] - 1;  // decreases
  DeviceArray<int> dcu_q(batch.cu_q.size()), dcu_k(cu_k.size());
  dcu_q.upload(batch.cu_q), dcu_k.upload(cu_k);
  AttentionOptions opt;
  opt.mask = MaskKind::causal;
  for (const bool deterministic : {true, false}) {
    call.run(opt, deterministic, dcu_q.ptr, dcu_k.ptr, nullptr, true);
    std::int64_t finite = 0;
    for (const auto* g : {&call.dq, &call.dk, &call.dv})
      for (const Bf16 x : g->download()) finite += !std::isnan(__bfloat162float(x));
    EXPECT_EQ(finite, 0) << (deterministic ? "two passes" : "one pass") << ": " << finite
                         << " gradient elements are not NaN, seed " << seed;
  }
}

TEST(GpuBackwardPackedErrors, NameTheArgument) {
  FP4ATTN_REQUIRE_HOPPER();
  const AttentionShape s{2, 2, 2, 128, 128, 64};
  BackwardCall call(s, 256, 256);
  DeviceArray<int> cu(3);
  cu.upload({0, 100, 256});
  AttentionOptions opt;
  const auto run = [&](const int* cu_q, const int* cu_k) { call.run(opt, true, cu_q, cu_k); };
  EXPECT_EQ(named_argument([&] { run(cu.ptr, nullptr); }), "cu_seqlens");
  opt.recipe = Recipe::mxfp4_train;
  EXPECT_EQ(named_argument([&] { run(cu.ptr, cu.ptr); }), "recipe");
}

}  // namespace
}  // namespace fp4attn
