// Packed sequences (FlashAttention's varlen batches) on caller-quantized E4M3
// inputs: one call over every sequence gives each sequence the bits of a
// dense E4M3 call on it alone (its own descales), for lengths on and off the
// 128-token tiles, a sequence without queries and one without keys, GQA and
// strided rows whose gaps hold NaN codes. cu_seqlens that do not fit, a NaN
// code and a bad descale (of any sequence) give NaN everywhere.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "dispatch/sm90_executor.hpp"
#include "e4m3_inputs_fixture.hpp"
#include "fp4attn/attention.hpp"
#include "fp4attn/error.hpp"
#include "gpu/e4m3_device_run.hpp"
#include "gpu/gpu_test_util.hpp"
#include "gpu/packed_batch.hpp"  // PackedBatch, named_argument

namespace fp4attn::gpu_test {
namespace {

using e4m3_test::Problem;
using e4m3_test::random_codes;
using e4m3_test::random_descales;

constexpr std::int64_t kPad = 16;  // bytes after each (token, head) row of the packed tensors, NaN codes

struct PackedE4m3Case {
  std::int64_t Hq, Hkv, D;
  MaskKind mask;
  bool direct_p;
};

AttentionOptions options(const PackedE4m3Case& c) {
  AttentionOptions opt;
  opt.recipe = Recipe::fp8;
  opt.smooth_k = false;
  opt.mask = c.mask;
  opt.direct_p = c.direct_p;
  return opt;
}

// The batch: sequence 3 has no queries, sequence 5 no keys.
struct Batch : PackedBatch {
  Batch() : PackedBatch({5, 300, 129, 0, 128, 50, 700}, {9, 300, 3, 40, 200, 0, 700}) {}
};

// Packed codes (tokens, H, D) as rows of D + kPad bytes, NaN codes in the gaps.
std::vector<std::uint8_t> with_gaps(const std::vector<std::uint8_t>& x, std::int64_t D) {
  const std::int64_t rows = static_cast<std::int64_t>(x.size()) / D;
  std::vector<std::uint8_t> out(static_cast<std::size_t>(rows * (D + kPad)), 0x7F);
  for (std::int64_t r = 0; r < rows; ++r) std::copy_n(x.begin() + r * D, D, out.begin() + r * (D + kPad));
  return out;
}

// One packed call on device copies of the codes and descales.
struct PackedCall {
  Batch batch;
  AttentionShape shape;
  DeviceArray<std::uint8_t> q, k, v;
  DeviceArray<float> q_descale, k_descale, v_descale;
  DeviceArray<int> cu_q, cu_k;
  DeviceArray<std::uint16_t> o;
  DeviceArray<float> lse;
  DeviceArray<unsigned char> workspace;

  PackedCall(const Batch& b, std::int64_t Hq, std::int64_t Hkv, std::int64_t D, const std::vector<std::uint8_t>& hq,
             const std::vector<std::uint8_t>& hk, const std::vector<std::uint8_t>& hv, const std::vector<float>& dq,
             const std::vector<float>& dk, const std::vector<float>& dv)
      : batch(b),
        shape{b.n, Hq, Hkv, b.max_q, b.max_k, D},
        q(hq.size() / D * (D + kPad)),
        k(hk.size() / D * (D + kPad)),
        v(hv.size() / D * (D + kPad)),
        q_descale(dq.size()),
        k_descale(dk.size()),
        v_descale(dv.size()),
        cu_q(b.cu_q.size()),
        cu_k(b.cu_k.size()),
        o(static_cast<std::size_t>(b.total_q * Hq * D)),
        lse(static_cast<std::size_t>(b.total_q * Hq)),
        workspace(dispatch::sm90_device_e4m3_workspace_bytes(shape, {b.total_q, b.total_k})) {
    q.upload(with_gaps(hq, D)), k.upload(with_gaps(hk, D)), v.upload(with_gaps(hv, D));
    q_descale.upload(dq), k_descale.upload(dk), v_descale.upload(dv);
    cu_q.upload(b.cu_q), cu_k.upload(b.cu_k);
  }

  dispatch::DeviceE4m3ForwardArgs args() {
    const std::int64_t row = shape.D + kPad;
    dispatch::DeviceE4m3ForwardArgs a;
    a.shape = shape;
    a.q = {q.ptr, 0, shape.Hq * row, row};
    a.k = {k.ptr, 0, shape.Hkv * row, row};
    a.v = {v.ptr, 0, shape.Hkv * row, row};
    a.q_descale = q_descale.ptr, a.k_descale = k_descale.ptr, a.v_descale = v_descale.ptr;
    a.o = o.ptr;
    a.o_stride_b = 0, a.o_stride_s = shape.Hq * shape.D, a.o_stride_h = shape.D;
    a.lse = lse.ptr;
    a.workspace = workspace.ptr, a.workspace_bytes = workspace.bytes();
    a.cu_seqlens_q = cu_q.ptr, a.cu_seqlens_k = cu_k.ptr;
    a.lse_pitch = batch.total_q, a.k_tokens = batch.total_k;
    return a;
  }

  // O as floats and the (Hq, total_q) LSE, outputs poisoned and the workspace
  // filled with NaN codes first.
  ForwardOutput run(const dispatch::DeviceE4m3ForwardArgs& a, const AttentionOptions& opt) {
    workspace.poison();
    return run_e4m3_device(a, opt, o, lse);
  }
};

struct PackedProblem {
  Batch batch;
  std::vector<std::uint8_t> q, k, v;                   // (total, H, D)
  std::vector<float> q_descale, k_descale, v_descale;  // (sequences, Hkv)
};

PackedProblem random_packed(const Batch& b, std::int64_t Hq, std::int64_t Hkv, std::int64_t D, std::uint32_t seed) {
  std::mt19937 rng(seed);
  PackedProblem p{b, {}, {}, {}, {}, {}, {}};
  p.q = random_codes(static_cast<std::size_t>(b.total_q * Hq * D), 40.0f, rng);
  p.k = random_codes(static_cast<std::size_t>(b.total_k * Hkv * D), 40.0f, rng);
  p.v = random_codes(static_cast<std::size_t>(b.total_k * Hkv * D), 100.0f, rng);
  const auto heads = static_cast<std::size_t>(b.n * Hkv);
  p.q_descale = random_descales(heads, 1.0f / 256, 1.0f / 16, rng);
  p.k_descale = random_descales(heads, 1.0f / 128, 1.0f / 32, rng);
  p.v_descale = random_descales(heads, 1.0f / 512, 1.0f / 4, rng);
  return p;
}

bool all_nan(const ForwardOutput& r) {
  for (float x : r.o)
    if (!std::isnan(x)) return false;
  for (float x : r.lse)
    if (!std::isnan(x)) return false;
  return true;
}

class GpuForwardE4m3Packed : public testing::TestWithParam<PackedE4m3Case> {};

TEST_P(GpuForwardE4m3Packed, EachSequenceIsItsOwnCall) {
  FP4ATTN_REQUIRE_HOPPER();
  const PackedE4m3Case c = GetParam();
  const std::uint32_t seed = fresh_seed();
  const Batch batch;
  const PackedProblem p = random_packed(batch, c.Hq, c.Hkv, c.D, seed);
  const AttentionOptions opt = options(c);
  PackedCall call(batch, c.Hq, c.Hkv, c.D, p.q, p.k, p.v, p.q_descale, p.k_descale, p.v_descale);
  const ForwardOutput packed = call.run(call.args(), opt);
  const std::int64_t Hq = c.Hq, Hkv = c.Hkv, D = c.D, total_q = batch.total_q;

  for (std::int64_t b = 0; b < batch.n; ++b) {
    const std::int64_t lq = batch.lens_q[b], lk = batch.lens_k[b], q0 = batch.cu_q[b], k0 = batch.cu_k[b];
    const std::string where = "sequence " + std::to_string(b) + " (" + std::to_string(lq) + " queries, " +
                              std::to_string(lk) + " keys), seed " + std::to_string(seed);
    if (lq == 0) continue;
    if (lk == 0) {  // no keys: O = 0 and LSE = −inf, as a fully masked row
      for (std::int64_t i = 0; i < lq * Hq * D; ++i) ASSERT_EQ(packed.o[q0 * Hq * D + i], 0.0f) << where;
      for (std::int64_t h = 0; h < Hq; ++h)
        for (std::int64_t r = 0; r < lq; ++r) ASSERT_EQ(packed.lse[h * total_q + q0 + r], -INFINITY) << where;
      continue;
    }
    Problem one;
    one.shape = {1, Hq, Hkv, lq, lk, D};
    one.q.assign(p.q.begin() + q0 * Hq * D, p.q.begin() + (q0 + lq) * Hq * D);
    one.k.assign(p.k.begin() + k0 * Hkv * D, p.k.begin() + (k0 + lk) * Hkv * D);
    one.v.assign(p.v.begin() + k0 * Hkv * D, p.v.begin() + (k0 + lk) * Hkv * D);
    one.q_descale.assign(p.q_descale.begin() + b * Hkv, p.q_descale.begin() + (b + 1) * Hkv);
    one.k_descale.assign(p.k_descale.begin() + b * Hkv, p.k_descale.begin() + (b + 1) * Hkv);
    one.v_descale.assign(p.v_descale.begin() + b * Hkv, p.v_descale.begin() + (b + 1) * Hkv);
    const ForwardOutput alone = forward_e4m3(one.shape, one.inputs(), opt, Executor::sm90);
    std::int64_t o_differ = 0, lse_differ = 0, nan = 0;
    for (std::int64_t i = 0; i < lq * Hq * D; ++i) {
      const float x = packed.o[q0 * Hq * D + i];
      nan += std::isnan(x);
      o_differ += __builtin_bit_cast(std::uint32_t, x) != __builtin_bit_cast(std::uint32_t, alone.o[i]);
    }
    for (std::int64_t h = 0; h < Hq; ++h)
      for (std::int64_t r = 0; r < lq; ++r)
        lse_differ += __builtin_bit_cast(std::uint32_t, packed.lse[h * total_q + q0 + r]) !=
                      __builtin_bit_cast(std::uint32_t, alone.lse[h * lq + r]);
    EXPECT_EQ(nan, 0) << where;
    EXPECT_EQ(o_differ, 0) << where;
    EXPECT_EQ(lse_differ, 0) << where;
  }
}

std::string packed_name(const testing::TestParamInfo<PackedE4m3Case>& info) {
  const PackedE4m3Case& c = info.param;
  return "Hq" + std::to_string(c.Hq) + "_Hkv" + std::to_string(c.Hkv) + "_D" + std::to_string(c.D) +
         (c.mask == MaskKind::causal ? "_causal" : "_full") + (c.direct_p ? "_directp" : "_exp2");
}

// Heads per preparation CTA: D = 128 two (Hkv = 2) and Q's four; D = 64 with
// three kv heads three; D = 96 one and two.
INSTANTIATE_TEST_SUITE_P(Packed, GpuForwardE4m3Packed,
                         testing::Values(PackedE4m3Case{4, 2, 128, MaskKind::none, true},
                                         PackedE4m3Case{4, 2, 128, MaskKind::causal, false},
                                         PackedE4m3Case{6, 3, 64, MaskKind::causal, true},
                                         PackedE4m3Case{2, 1, 96, MaskKind::none, true}),
                         packed_name);

// The device checks what the host cannot read without waiting: cu_seqlens
// that do not fit the call, NaN codes and bad descales, those of a sequence
// without queries included, all give NaN in every output element.
TEST(GpuForwardE4m3PackedCheck, BadInputGivesNaNEverywhere) {
  FP4ATTN_REQUIRE_HOPPER();
  const Batch batch;
  const std::int64_t Hq = 4, Hkv = 2, D = 64;
  const PackedProblem base = random_packed(batch, Hq, Hkv, D, fresh_seed());
  AttentionOptions opt = options({Hq, Hkv, D, MaskKind::none, true});
  const auto run = [&](const PackedProblem& p, auto&& change_args) {
    PackedCall call(batch, Hq, Hkv, D, p.q, p.k, p.v, p.q_descale, p.k_descale, p.v_descale);
    dispatch::DeviceE4m3ForwardArgs a = call.args();
    change_args(a, call);
    return call.run(a, opt);
  };
  const auto same = [](dispatch::DeviceE4m3ForwardArgs&, PackedCall&) {};
  EXPECT_FALSE(all_nan(run(base, same)));
  const auto with = [&](auto&& change) {
    PackedProblem p = base;
    change(p);
    return all_nan(run(p, same));
  };
  EXPECT_TRUE(with([&](PackedProblem& p) { p.q[(batch.cu_q[6] + 3) * Hq * D + 7] = 0xFF; })) << "NaN code in q";
  EXPECT_TRUE(with([&](PackedProblem& p) { p.k[batch.cu_k[2] * Hkv * D] = 0x7F; })) << "NaN code in k";
  EXPECT_TRUE(with([&](PackedProblem& p) { p.v.back() = 0x7F; })) << "NaN code in v";
  EXPECT_TRUE(with([&](PackedProblem& p) { p.q_descale[3 * Hkv + 1] = 0.0f; })) << "q_descale of the sequence without queries";
  EXPECT_TRUE(with([&](PackedProblem& p) { p.v_descale[5 * Hkv] = INFINITY; })) << "v_descale of the sequence without keys";
  // cu_seqlens that do not fit the call: its longest sequence a query short.
  EXPECT_TRUE(all_nan(run(base, [&](dispatch::DeviceE4m3ForwardArgs& a, PackedCall&) { a.shape.Sq -= 1; })))
      << "a sequence longer than shape.Sq";
  // And decreasing offsets.
  EXPECT_TRUE(all_nan(run(base, [&](dispatch::DeviceE4m3ForwardArgs& a, PackedCall& call) {
    std::vector<int> cu = batch.cu_k;
    std::swap(cu[1], cu[2]);
    call.cu_k.upload(cu);
    a.cu_seqlens_k = call.cu_k.ptr;
  }))) << "cu_seqlens_k decreasing";
}

TEST(GpuForwardE4m3PackedCheck, NamesTheArgument) {
  FP4ATTN_REQUIRE_HOPPER();
  const Batch batch;
  const PackedProblem p = random_packed(batch, 2, 1, 64, 1);
  PackedCall call(batch, 2, 1, 64, p.q, p.k, p.v, p.q_descale, p.k_descale, p.v_descale);
  const AttentionOptions opt = options({2, 1, 64, MaskKind::none, true});
  const auto argument_of = [&](const dispatch::DeviceE4m3ForwardArgs& a) {
    return named_argument([&] { dispatch::sm90_forward_device_e4m3(a, opt, nullptr); });
  };
  dispatch::DeviceE4m3ForwardArgs a = call.args();
  a.cu_seqlens_k = nullptr;
  EXPECT_EQ(argument_of(a), "cu_seqlens");
  a = call.args();
  a.lse_pitch = 0;
  EXPECT_EQ(argument_of(a), "lse_pitch");
  a = call.args();
  a.k_tokens = 0;
  EXPECT_EQ(argument_of(a), "k_tokens");
  a = call.args();
  a.workspace_bytes -= 1;
  EXPECT_EQ(argument_of(a), "workspace");
  a = call.args();
  a.v.stride_s += 8;
  EXPECT_EQ(argument_of(a), "v");
}

}  // namespace
}  // namespace fp4attn::gpu_test
