// GPU suites for recipe fp8 on sm90 (the quantizer's own suite is
// test_quantize_gpu.cu): the forward kernel against the CPU emulator
// (target sm90, same inputs): known answer first, then random shapes with odd
// lengths, GQA, bottom-right causal with Sq ≠ Sk, fully masked rows, strided
// tensors, both head dims and Direct-P on and off; finally the public API.
#include <cmath>
#include <cstdio>
#include <string>

#include "cuda/quantize/quantize_fp8.hpp"
#include "cuda/sm90/fwd/fwd.hpp"
#include "fp4attn/attention.hpp"
#include "fp4attn/emulator.hpp"
#include "fp4attn/error.hpp"
#include "fp4attn/metrics.hpp"
#include "gpu/forward_check.hpp"
#include "gpu/gpu_test_util.hpp"

namespace fp4attn {
namespace {

using gpu_test::DeviceArray;
namespace cq = cuda_quantize;

constexpr double kMaxRelL2 = gpu_test::kForwardMaxRelL2;
constexpr double kMaxLseDiff = gpu_test::kForwardMaxLseDiff;
constexpr std::int64_t kHeadPad = 1;  // extra head slot in device layouts: strides ≠ contiguous

struct Case {
  AttentionShape shape;
  MaskKind mask;
  bool direct_p;
  bool smooth_k;
  float outlier = 1.0f;  // magnitude of the rare outliers in Q and K (1: none)
  int consumers = 0;     // Fp8ForwardArgs::consumers (0: the launcher's choice)
  Window window{};       // a sliding window (none by default)
};

std::string describe(const Case& c, std::uint32_t seed) {
  const auto& s = c.shape;
  return "B=" + std::to_string(s.B) + " Hq=" + std::to_string(s.Hq) + " Hkv=" + std::to_string(s.Hkv) +
         " Sq=" + std::to_string(s.Sq) + " Sk=" + std::to_string(s.Sk) + " D=" + std::to_string(s.D) +
         " mask=" + std::to_string(static_cast<int>(c.mask)) + " direct_p=" + std::to_string(c.direct_p) +
         " smooth_k=" + std::to_string(c.smooth_k) + " outlier=" + std::to_string(c.outlier) +
         " consumers=" + std::to_string(c.consumers) + " window=" + std::to_string(c.window.left) + "," +
         std::to_string(c.window.right) + " seed=" + std::to_string(seed);
}

// Test name of a grid case, e.g. B2_Hq4_Hkv2_Sq200_Sk333_D64_causal_directp_smoothk,
// so CTest lists (and skips) each case by what it covers.
std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  const Case& c = info.param;
  std::string name = gpu_test::shape_mask_name(c.shape, c.mask) + (c.direct_p ? "_directp" : "_exp2") +
                     (c.smooth_k ? "_smoothk" : "");
  if (c.outlier != 1.0f) name += "_outliers";
  if (c.consumers != 0) name += "_" + std::to_string(c.consumers) + "consumers";
  const auto bound = [](std::int64_t b) { return b < 0 ? std::string("inf") : std::to_string(b); };
  if (c.window.bounded()) name += "_window" + bound(c.window.left) + "_" + bound(c.window.right);
  return name;
}

// A logical (B, S, H, D) tensor stored on the device as bf16 in (B, S, H + pad, D).
struct StridedBf16 {
  DeviceArray<__nv_bfloat16> data;
  cq::StridedInput view;
  StridedBf16(const std::vector<float>& x, std::int64_t B, std::int64_t S, std::int64_t H, std::int64_t D)
      : data(static_cast<std::size_t>(B * S * (H + kHeadPad) * D)) {
    std::vector<__nv_bfloat16> h(data.count, __float2bfloat16_rn(0.0f));
    for (std::int64_t i = 0; i < B * S * H; ++i)
      for (std::int64_t d = 0; d < D; ++d) {
        const std::int64_t bs = i / H, hh = i % H;
        h[(bs * (H + kHeadPad) + hh) * D + d] = __float2bfloat16_rn(x[i * D + d]);
      }
    data.upload(h);
    view = {data.ptr, cq::ElementType::bf16, B, S, H, D, S * (H + kHeadPad) * D, (H + kHeadPad) * D, D};
  }
};

// Quantized operands on the device, as the kernel reads them.
struct DeviceFp8 {
  std::int64_t vt_keys;
  DeviceArray<std::uint8_t> q, k, vt;
  DeviceArray<float> q_scale, k_scale, v_scale, k_mean, lse_shift;
  DeviceArray<int> flags;
  cq::Fp8Buffers bufs;
  explicit DeviceFp8(const AttentionShape& s)
      : vt_keys(cq::padded_keys(s.Sk)),
        q(s.q_elems()),
        k(s.kv_elems()),
        vt(s.B * s.Hkv * s.D * vt_keys),
        q_scale(s.B * s.Hq * ((s.Sq + 127) / 128)),
        k_scale(s.B * s.Hkv * ((s.Sk + 127) / 128)),
        v_scale(s.B * s.Hkv * s.D),
        k_mean(s.B * s.Hkv * s.D),
        lse_shift(s.lse_elems()),
        flags(3) {
    for (auto* a : {&q, &k, &vt}) a->poison();
    for (auto* a : {&q_scale, &k_scale, &v_scale, &k_mean, &lse_shift}) a->poison();
    cudaMemset(flags.ptr, 0, flags.bytes());
    bufs = {q.ptr, q_scale.ptr, k.ptr, k_scale.ptr, vt.ptr, v_scale.ptr, k_mean.ptr, lse_shift.ptr, vt_keys, flags.ptr};
  }
};

struct GpuResult {
  std::vector<float> o, lse;
};

// Quantize on the GPU and run the kernel into poisoned, strided outputs.
// o_skew elements shift O's base and token stride off 16-byte boundaries,
// where the kernel stores O from its threads instead of by TMA.
GpuResult run_gpu(const Case& c, const std::vector<float>& q, const std::vector<float>& k, const std::vector<float>& v,
                  std::int64_t o_skew = 0) {
  const AttentionShape& s = c.shape;
  StridedBf16 dq(q, s.B, s.Sq, s.Hq, s.D), dk(k, s.B, s.Sk, s.Hkv, s.D), dv(v, s.B, s.Sk, s.Hkv, s.D);
  DeviceFp8 dev(s);
  const float scale = 1.0f / std::sqrt(static_cast<float>(s.D));
  cq::quantize_fp8(dq.view, dk.view, dv.view, c.smooth_k, scale, dev.bufs, nullptr);
  cq::check_finite(dev.bufs, nullptr);

  const std::int64_t o_stride_s = (s.Hq + kHeadPad) * s.D + o_skew;
  DeviceArray<__nv_bfloat16> o(static_cast<std::size_t>(s.B * s.Sq * o_stride_s + o_skew));
  DeviceArray<float> lse(s.lse_elems());
  o.poison();
  lse.poison();
  sm90::fwd::Fp8ForwardArgs a;
  a.q = dev.q.ptr, a.q_stride_b = s.Sq * s.Hq * s.D, a.q_stride_s = s.Hq * s.D, a.q_stride_h = s.D;
  a.k = dev.k.ptr, a.k_stride_b = s.Sk * s.Hkv * s.D, a.k_stride_s = s.Hkv * s.D, a.k_stride_h = s.D;
  a.vt = dev.vt.ptr, a.vt_keys = dev.vt_keys;
  a.q_scale = dev.q_scale.ptr, a.k_scale = dev.k_scale.ptr, a.v_scale = dev.v_scale.ptr;
  a.lse_shift = c.smooth_k ? dev.lse_shift.ptr : nullptr;
  a.o = o.ptr + o_skew, a.o_stride_b = s.Sq * o_stride_s, a.o_stride_s = o_stride_s, a.o_stride_h = s.D;
  a.lse = lse.ptr;
  a.B = s.B, a.Hq = s.Hq, a.Hkv = s.Hkv, a.Sq = s.Sq, a.Sk = s.Sk, a.D = s.D;
  a.softmax_scale = scale;
  a.mask = c.mask;
  a.window_left = static_cast<int>(c.window.left), a.window_right = static_cast<int>(c.window.right);
  a.p_code = c.direct_p ? sm90::fwd::PCode::direct_p : sm90::fwd::PCode::exp2_cvt;
  a.consumers = c.consumers;
  sm90::fwd::forward_fp8(a, nullptr);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);

  GpuResult r;
  const auto o_raw = o.download();
  r.o.resize(s.q_elems());
  for (std::int64_t i = 0; i < s.B * s.Sq * s.Hq; ++i)
    for (std::int64_t d = 0; d < s.D; ++d)
      r.o[i * s.D + d] = __bfloat162float(o_raw[o_skew + (i / s.Hq) * o_stride_s + (i % s.Hq) * s.D + d]);
  r.lse = lse.download();
  return r;
}

void check_against_emulator(const Case& c, const GpuResult& got, const emulator::ForwardResult& want,
                            const std::string& where) {
  gpu_test::expect_forward_matches_emulator(got.o, got.lse, want, "fp8", std::string(c.direct_p ? "directp " : "exp2 ") + where);
}

TEST(GpuForwardFp8, KnownAnswerZeroScoresUnitValues) {
  FP4ATTN_REQUIRE_HOPPER();
  // Q = K = 0, V = 1: every key weighs the same, so O = 1 and LSE = ln Sk.
  const Case c{{1, 2, 1, 200, 333, 128}, MaskKind::none, true, true};
  const AttentionShape& s = c.shape;
  const std::vector<float> q(s.q_elems(), 0.0f), k(s.kv_elems(), 0.0f), v(s.kv_elems(), 1.0f);
  const GpuResult r = run_gpu(c, q, k, v);
  for (float x : r.o) ASSERT_EQ(x, 1.0f);
  for (float x : r.lse) ASSERT_NEAR(x, std::log(static_cast<double>(s.Sk)), kMaxLseDiff);
}

class GpuForwardGrid : public ::testing::TestWithParam<Case> {};

// Every element of Q and K made positive, then query rows in the first half
// of the sequence and keys in the second half negated: the first half of
// the queries scores positive against the first half of the keys and
// negative against the rest, the second half the other way round.
void set_score_signs(const AttentionShape& s, std::vector<float>& q, std::vector<float>& k) {
  // (B, S, H, D): the token of element i is i / (H·D) % S.
  for (std::size_t i = 0; i < q.size(); ++i)
    q[i] = (static_cast<std::int64_t>(i) / (s.Hq * s.D) % s.Sq < s.Sq / 2 ? 1.0f : -1.0f) * std::fabs(q[i]);
  for (std::size_t i = 0; i < k.size(); ++i)
    k[i] = (static_cast<std::int64_t>(i) / (s.Hkv * s.D) % s.Sk < s.Sk / 2 ? 1.0f : -1.0f) * std::fabs(k[i]);
}

// Random inputs of the case (with signed_scores, set_score_signs on Q and
// K), the kernel (O stored with o_skew, see run_gpu) against the emulator.
void expect_case_matches_emulator(const Case& c, std::int64_t o_skew = 0, bool signed_scores = false) {
  const std::uint32_t seed = gpu_test::fresh_seed();
  std::mt19937 rng(seed);
  const AttentionShape& s = c.shape;
  auto q = gpu_test::attention_input(s.q_elems(), s.D, 0.5f, rng, c.outlier);
  auto k = gpu_test::attention_input(s.kv_elems(), s.D, 3.0f, rng, c.outlier);
  const auto v = gpu_test::attention_input(s.kv_elems(), s.D, 1.0f, rng);
  if (signed_scores) set_score_signs(s, q, k);
  AttentionOptions opt;
  opt.mask = c.mask;
  opt.window = c.window;
  opt.direct_p = c.direct_p;
  opt.smooth_k = c.smooth_k;
  const GpuResult got = run_gpu(c, q, k, v, o_skew);
  const emulator::ForwardResult want = emulator::forward(s, q, k, v, opt);
  check_against_emulator(c, got, want, "o_skew " + std::to_string(o_skew) + " " + describe(c, seed));
}

TEST_P(GpuForwardGrid, MatchesEmulator) {
  FP4ATTN_REQUIRE_HOPPER();
  expect_case_matches_emulator(GetParam());
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, GpuForwardGrid,
    ::testing::Values(
        Case{{1, 2, 2, 128, 128, 128}, MaskKind::none, true, true},
        Case{{1, 2, 2, 128, 128, 128}, MaskKind::none, false, true},
        Case{{2, 4, 2, 200, 333, 64}, MaskKind::causal, true, true},      // GQA, odd lengths, Sq < Sk
        Case{{2, 4, 2, 200, 333, 64}, MaskKind::causal, false, true},
        Case{{1, 2, 1, 300, 150, 128}, MaskKind::causal, true, true},     // Sq > Sk: rows 0..149 fully masked
        Case{{1, 2, 1, 300, 150, 128}, MaskKind::causal, false, false},
        Case{{1, 3, 1, 77, 515, 128}, MaskKind::causal, true, false},     // MQA
        Case{{2, 2, 2, 513, 1000, 64}, MaskKind::none, true, true},
        Case{{2, 2, 2, 513, 1000, 64}, MaskKind::none, false, true},
        Case{{1, 4, 4, 1024, 1024, 128}, MaskKind::causal, true, true},
        Case{{1, 4, 4, 1024, 1024, 128}, MaskKind::none, false, true},
        Case{{1, 2, 2, 1, 1, 64}, MaskKind::none, true, true},
        Case{{1, 2, 2, 129, 257, 128}, MaskKind::causal_top_left, true, true},
        Case{{1, 2, 2, 256, 512, 128}, MaskKind::none, true, true, 8.0f},   // rare 8x outliers in Q and K
        Case{{1, 2, 2, 256, 512, 64}, MaskKind::causal, false, true, 8.0f},
        // Three consumer warpgroups (192-row CTAs, D = 64): the launcher picks
        // them for long noncausal sequences only, which these sizes are not.
        Case{{2, 2, 2, 513, 1000, 64}, MaskKind::none, true, true, 1.0f, 3},    // last CTA: one row of 192
        Case{{1, 4, 4, 1024, 1024, 64}, MaskKind::none, false, true, 1.0f, 3},
        Case{{1, 2, 2, 1, 1, 64}, MaskKind::none, true, false, 1.0f, 3},
        Case{{2, 4, 2, 200, 333, 64}, MaskKind::causal, true, true, 1.0f, 3},
        Case{{1, 2, 2, 450, 257, 64}, MaskKind::causal_top_left, true, true, 1.0f, 3},
        Case{{1, 2, 2, 256, 512, 64}, MaskKind::causal, false, true, 8.0f, 3},
        Case{{1, 2, 1, 300, 150, 64}, MaskKind::causal, true, true, 1.0f, 3},    // Sq > Sk: rows 0..149 fully masked
        Case{{1, 2, 1, 500, 100, 64}, MaskKind::causal, false, true, 1.0f, 3},  // first CTA: no visible key
        // One consumer warpgroup (64-row CTAs, two an SM; D = 64), which the
        // launcher picks where a CTA's keys are few: forced here also past that range.
        Case{{2, 4, 2, 200, 333, 64}, MaskKind::causal, true, true, 1.0f, 1},
        Case{{2, 4, 2, 200, 333, 64}, MaskKind::causal, false, true, 1.0f, 1},
        Case{{1, 2, 1, 300, 150, 64}, MaskKind::causal, true, true, 1.0f, 1},    // Sq > Sk: rows 0..149 fully masked
        Case{{1, 2, 1, 500, 100, 64}, MaskKind::causal, false, true, 1.0f, 1},   // first CTAs: no visible key
        Case{{2, 2, 2, 513, 1000, 64}, MaskKind::none, true, true, 1.0f, 1},
        Case{{1, 4, 4, 2048, 2048, 64}, MaskKind::none, true, true, 1.0f, 1},
        Case{{1, 2, 2, 2048, 1536, 64}, MaskKind::causal, true, false, 1.0f, 1},
        Case{{1, 2, 2, 1, 1, 64}, MaskKind::none, true, true, 1.0f, 1},
        Case{{1, 2, 2, 129, 257, 64}, MaskKind::causal_top_left, true, true, 1.0f, 1},
        Case{{1, 2, 2, 256, 512, 64}, MaskKind::causal, false, true, 8.0f, 1},
        // One consumer at D = 128 with exp2 P (two CTAs an SM, two K/V stages),
        // the launcher's choice there; and two, forced.
        Case{{2, 4, 2, 200, 333, 128}, MaskKind::causal, false, true, 1.0f, 1},
        Case{{1, 2, 1, 300, 150, 128}, MaskKind::causal, false, true, 1.0f, 1},  // Sq > Sk: rows 0..149 fully masked
        Case{{1, 2, 1, 500, 100, 128}, MaskKind::causal, false, false, 1.0f, 1},  // first CTAs: no visible key
        Case{{2, 2, 2, 513, 1000, 128}, MaskKind::none, false, true, 1.0f, 1},
        Case{{1, 2, 2, 129, 257, 128}, MaskKind::causal_top_left, false, true, 1.0f, 1},
        Case{{1, 2, 2, 256, 512, 128}, MaskKind::none, false, true, 8.0f, 1},
        Case{{1, 2, 1, 300, 150, 128}, MaskKind::causal, false, true, 1.0f, 2},
        Case{{1, 4, 4, 1024, 1024, 128}, MaskKind::none, false, true, 1.0f, 2},
        // Two consumers at D = 64, where the launcher takes one or three.
        Case{{2, 4, 2, 200, 333, 64}, MaskKind::causal, true, true, 1.0f, 2},
        Case{{1, 2, 1, 300, 150, 64}, MaskKind::causal, true, true, 1.0f, 2},
        Case{{1, 2, 2, 256, 512, 64}, MaskKind::none, true, true, 8.0f, 2},
        Case{{1, 4, 4, 1024, 1024, 64}, MaskKind::causal, false, true, 1.0f, 2},
        // Narrower head dims, read with zero channels by TMA on the 64- and 128-wide kernels.
        Case{{1, 4, 2, 300, 333, 80}, MaskKind::causal, true, true},
        Case{{2, 2, 2, 513, 400, 48}, MaskKind::none, true, true},
        Case{{1, 2, 2, 200, 200, 16}, MaskKind::causal, false, true},
        Case{{2, 4, 2, 200, 333, 96}, MaskKind::causal, true, true},
        Case{{1, 2, 1, 300, 150, 96}, MaskKind::causal, false, false},  // Sq > Sk: rows 0..149 fully masked
        Case{{2, 2, 2, 513, 1000, 96}, MaskKind::none, true, true},
        Case{{2, 4, 2, 200, 333, 32}, MaskKind::causal, true, true},
        Case{{1, 2, 1, 300, 150, 32}, MaskKind::causal, false, false},  // Sq > Sk: rows 0..149 fully masked
        Case{{2, 2, 2, 513, 1000, 32}, MaskKind::none, true, true},
        Case{{2, 2, 2, 513, 1000, 32}, MaskKind::none, true, true, 1.0f, 3},
        Case{{1, 2, 2, 129, 257, 32}, MaskKind::causal_top_left, false, true},
        // D = 256 and the head dims above 128 read with zero channels: two CTAs
        // per query block, each computing S in full and storing half of O.
        Case{{1, 2, 2, 128, 128, 256}, MaskKind::none, true, true},
        Case{{2, 4, 2, 200, 333, 256}, MaskKind::causal, true, true},
        Case{{2, 4, 2, 200, 333, 256}, MaskKind::causal, false, true},
        Case{{1, 2, 1, 300, 150, 256}, MaskKind::causal, true, false},  // Sq > Sk: rows 0..149 fully masked
        Case{{2, 2, 2, 513, 1000, 256}, MaskKind::none, false, true},
        Case{{1, 2, 2, 256, 512, 256}, MaskKind::none, true, true, 8.0f},
        Case{{1, 2, 2, 129, 257, 256}, MaskKind::causal_top_left, true, true},
        Case{{1, 4, 2, 300, 333, 160}, MaskKind::causal, true, true},
        Case{{2, 2, 2, 513, 400, 192}, MaskKind::none, true, true},
        Case{{1, 2, 2, 200, 200, 224}, MaskKind::causal, false, true}),
    case_name);

// Sliding windows (FlashAttention's window_size): the CTA's tiles start at
// the first one its rows see, and the mask runs on tiles that cross either
// edge. Windows narrower than a tile, wider than several, one-sided and
// two-sided, with Sq ≠ Sk (the diagonal offset), rows that see nothing,
// both consumer counts at D = 64 and the split CTAs of D = 256.
INSTANTIATE_TEST_SUITE_P(
    Windows, GpuForwardGrid,
    ::testing::Values(
        Case{{1, 2, 2, 1024, 1024, 128}, MaskKind::causal, true, true, 1.0f, 0, {256, -1}},
        Case{{1, 2, 2, 1024, 1024, 128}, MaskKind::causal, false, true, 1.0f, 0, {256, -1}},
        Case{{2, 4, 2, 700, 900, 128}, MaskKind::causal, true, true, 1.0f, 0, {5, -1}},     // narrower than a tile
        Case{{2, 4, 2, 700, 900, 128}, MaskKind::none, true, true, 1.0f, 0, {100, 37}},    // two-sided
        Case{{1, 2, 1, 900, 300, 128}, MaskKind::none, true, false, 1.0f, 0, {0, 200}},    // Sq > Sk: d = −600
        Case{{1, 2, 1, 600, 300, 128}, MaskKind::causal, true, true, 1.0f, 0, {130, 0}},  // rows 0..299 see nothing
        // top-left, Sq > Sk: rows from 364 on see nothing
        Case{{1, 2, 2, 500, 300, 128}, MaskKind::causal_top_left, true, true, 1.0f, 0, {64, -1}},
        Case{{1, 2, 2, 333, 1500, 128}, MaskKind::none, true, true, 1.0f, 0, {-1, 10}},  // right bound only
        Case{{2, 4, 2, 700, 900, 64}, MaskKind::causal, true, true, 1.0f, 0, {200, -1}},
        Case{{2, 4, 2, 700, 900, 64}, MaskKind::causal, true, true, 1.0f, 3, {200, -1}},
        Case{{1, 4, 4, 1024, 1024, 64}, MaskKind::none, false, true, 1.0f, 3, {300, 300}},
        Case{{2, 4, 2, 700, 900, 64}, MaskKind::causal, false, true, 8.0f, 0, {129, -1}},
        Case{{2, 2, 2, 513, 1000, 256}, MaskKind::causal, true, true, 1.0f, 0, {150, -1}},
        Case{{2, 4, 2, 700, 900, 64}, MaskKind::none, true, true, 1.0f, 1, {100, 37}},
        Case{{2, 4, 2, 700, 900, 64}, MaskKind::causal, false, true, 1.0f, 1, {200, -1}},
        Case{{1, 2, 2, 1024, 1024, 128}, MaskKind::causal, true, true, 1.0f, 2, {256, -1}},
        Case{{2, 4, 2, 700, 900, 128}, MaskKind::causal, false, true, 1.0f, 1, {200, -1}},
        Case{{1, 4, 2, 300, 333, 80}, MaskKind::none, true, true, 1.0f, 0, {50, 50}}),
    case_name);

// Scores of a set sign (set_score_signs): whole tiles of a row, and so
// every thread's share of it, then score negative, which random inputs
// almost never do; the running max must then come from negative tile maxima
// and, with causal masks, sit beside masked keys (−inf). smooth_k (the
// second case) shifts K and blurs the signs; the others keep them exact.
TEST(GpuForwardFp8, ScoresOfEitherSignMatchEmulator) {
  FP4ATTN_REQUIRE_HOPPER();
  for (const Case& c : {Case{{1, 2, 2, 384, 640, 128}, MaskKind::none, true, false},
                        Case{{1, 2, 1, 384, 640, 128}, MaskKind::causal, true, true},
                        Case{{1, 2, 2, 384, 640, 64}, MaskKind::causal, false, false},
                        Case{{1, 2, 2, 450, 700, 64}, MaskKind::none, true, false, 1.0f, 3},
                        Case{{1, 2, 1, 384, 640, 256}, MaskKind::causal, true, false},
                        Case{{1, 2, 2, 384, 640, 64}, MaskKind::none, true, false, 1.0f, 2},
                        Case{{1, 2, 1, 384, 640, 64}, MaskKind::causal, true, false, 1.0f, 1}})
    expect_case_matches_emulator(c, /*o_skew=*/0, /*signed_scores=*/true);
}

// O whose rows do not start on 16-byte boundaries cannot be stored by TMA:
// the kernel's threads store it (every other case here takes TMA).
TEST(GpuForwardFp8, UnalignedOutputRowsMatchEmulator) {
  FP4ATTN_REQUIRE_HOPPER();
  for (const Case& c : {Case{{1, 3, 1, 200, 333, 128}, MaskKind::causal, true, true},
                        Case{{2, 2, 2, 513, 300, 64}, MaskKind::none, true, false, 1.0f, 3},
                        Case{{2, 2, 2, 130, 300, 32}, MaskKind::none, false, true},  // stores skip the zero channels
                        Case{{1, 3, 1, 200, 333, 96}, MaskKind::causal, true, true},
                        Case{{1, 3, 1, 200, 333, 256}, MaskKind::causal, true, true},  // each CTA its half
                        Case{{2, 2, 2, 130, 300, 176}, MaskKind::none, false, true},
                        Case{{1, 3, 1, 200, 333, 64}, MaskKind::causal, true, true, 1.0f, 1},
                        Case{{1, 3, 1, 200, 333, 64}, MaskKind::causal, true, true, 1.0f, 2}})
    expect_case_matches_emulator(c, /*o_skew=*/2);
}

// consumers = 3 exists at D = 64 only, and never where the producer expands
// MXFP4 (its 128 threads fill 128 query rows); consumers = 1 at D = 64 from
// E4M3 with FP8 P only; other counts do not exist.
TEST(GpuForwardFp8, RejectsConsumerCountsTheKernelDoesNotHave) {
  FP4ATTN_REQUIRE_HOPPER();
  const auto rejects = [](int D, int consumers, bool fp4_in) {
    sm90::fwd::Fp8ForwardArgs a;
    a.vt_keys = 128, a.B = 1, a.Hq = 1, a.Hkv = 1, a.Sq = 1, a.Sk = 1, a.D = D, a.softmax_scale = 1.0f;
    a.consumers = consumers;
    const std::uint8_t byte = 0;
    if (fp4_in) a.q_fp4 = &byte;
    try {
      sm90::fwd::forward_fp8(a, nullptr);
    } catch (const Error& e) {
      return e.argument() == "consumers";
    }
    return false;
  };
  EXPECT_TRUE(rejects(128, 3, false));
  EXPECT_TRUE(rejects(64, 3, true));
  EXPECT_TRUE(rejects(64, 1, true));
  EXPECT_TRUE(rejects(128, 1, false));  // with Direct-P (exp2 P has one at D = 128)
  EXPECT_TRUE(rejects(256, 1, false));
  EXPECT_TRUE(rejects(96, 1, false));
  EXPECT_TRUE(rejects(64, 4, false));
  EXPECT_TRUE(rejects(64, -1, false));
}

TEST(GpuForwardFp8, PublicApiRunsOnSm90) {
  FP4ATTN_REQUIRE_HOPPER();
  const AttentionShape s{1, 4, 2, 190, 260, 128};
  std::mt19937 rng(gpu_test::fresh_seed());
  const auto q = gpu_test::attention_input(s.q_elems(), s.D, 0.5f, rng);
  const auto k = gpu_test::attention_input(s.kv_elems(), s.D, 3.0f, rng);
  const auto v = gpu_test::attention_input(s.kv_elems(), s.D, 1.0f, rng);
  AttentionOptions opt;
  opt.mask = MaskKind::causal;
  const ForwardOutput got = forward(s, q, k, v, opt, Executor::automatic);
  EXPECT_EQ(got.executor, Executor::sm90);
  const emulator::ForwardResult want = emulator::forward(s, q, k, v, opt);
  EXPECT_LE(compare(got.o, want.o).rel_l2, kMaxRelL2);

  auto bad = q;
  bad[5] = INFINITY;
  try {
    forward(s, bad, k, v, opt, Executor::sm90);
    FAIL() << "non-finite q was not reported";
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), "q");
  }
}

}  // namespace
}  // namespace fp4attn
