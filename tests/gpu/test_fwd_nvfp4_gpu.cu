// GPU suite for recipe nvfp4 on sm90 (BF16 wgmma, DESIGN §3.4): the BF16
// expansion of the GPU NVFP4 quantizer's output against the emulator's sm90
// operands bit for bit, then the NVFP4 forward kernel against
// emulator::forward (target sm90, same inputs): known answer, random shapes
// with odd lengths, GQA and MQA, bottom-right causal with Sq ≠ Sk (fully
// masked rows), top-left causal, sliding windows, smooth_k on and off, both
// head dims, inputs with outliers, non-finite input and the arguments the
// kernel refuses; Direct-P and the exp2 baseline (Direct-P off).
//
// The emulator sums both products in fp32 (it does not model the BF16 tensor
// core's accumulation), so O is compared within the forward bounds (rel L2,
// |ΔLSE|), not element for element; the count of differing elements is printed.
#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "cuda/quantize/quantize_fp4.hpp"
#include "cuda/sm90/fwd/nvfp4_bf16/kernel.cuh"
#include "cuda/sm90/fwd/nvfp4_fwd.hpp"
#include "cuda/sm90/fwd/nvfp4_operands.hpp"
#include "dispatch/sm90_executor.hpp"
#include "emulator/ex2_sm90.hpp"
#include "emulator/operands.hpp"
#include "fp4attn/attention.hpp"
#include "fp4attn/direct_p.hpp"
#include "fp4attn/emulator.hpp"
#include "fp4attn/error.hpp"
#include "fp4attn/metrics.hpp"
#include "fp4attn/quantize.hpp"
#include "gpu/forward_check.hpp"
#include "gpu/gpu_test_util.hpp"

namespace fp4attn {
namespace {

using gpu_test::DeviceArray;
namespace cq = cuda_quantize;

constexpr double kMaxRelL2 = gpu_test::kForwardMaxRelL2;
constexpr double kMaxLseDiff = gpu_test::kForwardMaxLseDiff;
constexpr float kOutlier = 40.0f;  // one element in a thousand: NVFP4 blocks and tensor scales far from the bulk

struct Nvfp4Case {
  AttentionShape shape;
  MaskKind mask;
  bool smooth_k;
  bool outliers = false;
  bool direct_p = true;  // false: the exp2 baseline
  Window window{};       // a sliding window (none by default)
};

std::string case_name(const ::testing::TestParamInfo<Nvfp4Case>& info) {
  const Nvfp4Case& c = info.param;
  const auto bound = [](std::int64_t b) { return b < 0 ? std::string("inf") : std::to_string(b); };
  return gpu_test::shape_mask_name(c.shape, c.mask) + (c.smooth_k ? "_smoothk" : "") + (c.outliers ? "_outliers" : "") +
         (c.direct_p ? "" : "_exp2") +
         (c.window.bounded() ? "_window" + bound(c.window.left) + "_" + bound(c.window.right) : "");
}

// A contiguous (B, S, H, D) tensor on the device as bf16.
struct DeviceBf16 {
  DeviceArray<__nv_bfloat16> data;
  cq::StridedInput view;
  DeviceBf16(const std::vector<float>& x, std::int64_t B, std::int64_t S, std::int64_t H, std::int64_t D)
      : data(x.size()) {
    std::vector<__nv_bfloat16> h(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) h[i] = __float2bfloat16_rn(x[i]);
    data.upload(h);
    view = {data.ptr, cq::ElementType::bf16, B, S, H, D, S * H * D, H * D, D};
  }
};

std::vector<float> download_bf16(const void* ptr, std::size_t count) {
  std::vector<__nv_bfloat16> h(count);
  cudaMemcpy(h.data(), ptr, count * sizeof(__nv_bfloat16), cudaMemcpyDeviceToHost);
  std::vector<float> out(count);
  for (std::size_t i = 0; i < count; ++i) out[i] = __bfloat162float(h[i]);
  return out;
}

float download_float(const float* ptr) {
  float x = 0.0f;
  cudaMemcpy(&x, ptr, sizeof(float), cudaMemcpyDeviceToHost);
  return x;
}

// Random Q, K and V of shape s at the scales every test here uses (K's wider,
// so that the scores spread), drawn in that order from rng; `outlier` > 1
// puts one element in a thousand that far out.
struct Inputs {
  std::vector<float> q, k, v;
};
Inputs random_inputs(const AttentionShape& s, std::mt19937& rng, float outlier = 1.0f) {
  Inputs in;
  in.q = gpu_test::attention_input(s.q_elems(), s.D, 0.5f, rng, outlier);
  in.k = gpu_test::attention_input(s.kv_elems(), s.D, 3.0f, rng, outlier);
  in.v = gpu_test::attention_input(s.kv_elems(), s.D, 1.0f, rng, outlier);
  return in;
}

// ---- the kernel's P helpers against the shared host functions, bit for bit

__global__ void p_helpers_kernel(const float* u_max, int n_scales, std::uint32_t* scale, const float* u,
                                 const float* log2_sb, int n_codes, std::uint32_t* code) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n_scales) scale[i] = sm90::fwd::nvfp4::nvfp4_block_scale(u_max[i]);
  if (i < n_codes) code[i] = sm90::fwd::nvfp4::nvfp4_code(u[i], log2_sb[i]);
}

TEST(GpuNvfp4PHelpers, MatchSharedFunctions) {
  FP4ATTN_REQUIRE_HOPPER();
  std::mt19937 rng(gpu_test::fresh_seed());
  // Block scales: u_max over everything a row max can give (−inf, far below
  // P's range, and dense near 0), plus exact UE4M3 rounding midpoints of
  // 2^(u + 8) / 6 and their neighbours.
  std::vector<float> u_max = {-INFINITY, -1e31f, -200.0f, -30.0f, -21.0f, 0.0f, 1e-7f, 0.5f};
  std::uniform_real_distribution<float> wide(-24.0f, 0.5f);
  for (int i = 0; i < (1 << 20); ++i) u_max.push_back(wide(rng));
  for (int code = 1; code < 0x7E; ++code) {
    const float mid = 0.5f * (decode(ElemFormat::ue4m3, code) + decode(ElemFormat::ue4m3, code + 1));
    const float u0 = std::log2(6.0f * mid) - direct_p::kNvfp4Offset;
    float u = u0;
    for (int k = 0; k < 64; ++k) u = std::nextafter(u, -INFINITY);
    for (int k = 0; k < 128; ++k, u = std::nextafter(u, INFINITY)) u_max.push_back(u);
  }
  // Element codes: every finite block scale, u around each threshold by a few ulps, and u = −inf.
  std::vector<float> u, log2_sb;
  for (int sc = 0; sc < 0x7F; ++sc) {
    const float l2 = direct_p::log2_of_ue4m3(static_cast<std::uint8_t>(sc));
    for (float b : direct_p::kE2M1Log2Bounds) {
      float x = b + l2 - direct_p::kNvfp4Offset;
      if (!std::isfinite(x)) x = -5.0f;
      for (int k = 0; k < 8; ++k) x = std::nextafter(x, -INFINITY);
      for (int k = 0; k < 16; ++k, x = std::nextafter(x, INFINITY)) u.push_back(x), log2_sb.push_back(l2);
    }
    u.push_back(-INFINITY), log2_sb.push_back(l2);
    for (int k = 0; k < 64; ++k) u.push_back(wide(rng)), log2_sb.push_back(l2);
  }
  const int n_scales = static_cast<int>(u_max.size()), n_codes = static_cast<int>(u.size());
  DeviceArray<float> d_u_max(u_max.size()), d_u(u.size()), d_l2(log2_sb.size());
  DeviceArray<std::uint32_t> d_scale(u_max.size()), d_code(u.size());
  d_u_max.upload(u_max), d_u.upload(u), d_l2.upload(log2_sb);
  const int n = std::max(n_scales, n_codes);
  p_helpers_kernel<<<(n + 255) / 256, 256>>>(d_u_max.ptr, n_scales, d_scale.ptr, d_u.ptr, d_l2.ptr, n_codes,
                                             d_code.ptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const auto got_scale = d_scale.download(), got_code = d_code.download();
  std::size_t bad_scale = 0, bad_code = 0;
  for (int i = 0; i < n_scales; ++i) bad_scale += got_scale[i] != direct_p::nvfp4_block_scale(u_max[i]);
  for (int i = 0; i < n_codes; ++i) bad_code += got_code[i] != direct_p::nvfp4_code(u[i], log2_sb[i]);
  EXPECT_EQ(bad_scale, 0u) << "of " << n_scales;
  EXPECT_EQ(bad_code, 0u) << "of " << n_codes;
}

// The exp2 baseline's P helpers: the block scale of u_max and the element code
// of u under every UE4M3 scale, against the emulator's rules on the
// emulator's sm90 exp2 (ex2::sm90), bit for bit. Inputs crowd around every
// decision: u whose 2^(u + 8) is 6 × a UE4M3 rounding midpoint (scale) or an
// E2M1 midpoint × s_b (codes), a few dozen ulps either side, where only the
// measured ex2.approx table can make the two sides agree.
__global__ void p_exp2_helpers_kernel(const float* u, const std::uint8_t* scale_code, int n, std::uint32_t* scale,
                                      std::uint32_t* code) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  namespace nv = sm90::fwd::nvfp4;
  scale[i] = nv::nvfp4_block_scale_exp2(u[i]);
  const nv::PScaleEntry e = nv::p_scale_entry<false>(scale_code[i]);
  const std::uint32_t pair = nv::nvfp4_exp2_q_pair(u[i], u[i], e.scale * nv::kScaleFromTable, e.code_term);
  // Both halves carry the same code: 0x8 flags a difference between them.
  const std::uint32_t lo = (pair & 0xFFFFu) >> direct_p::kE2M1CodeShift, hi = pair >> (16 + direct_p::kE2M1CodeShift);
  code[i] = lo | (lo == hi ? 0u : 8u);
}

TEST(GpuNvfp4PHelpers, Exp2PathMatchesEmulatorRules) {
  FP4ATTN_REQUIRE_HOPPER();
  std::mt19937 rng(gpu_test::fresh_seed());
  std::vector<float> u;
  std::vector<std::uint8_t> sc;
  auto around = [&](double v, int ulps, std::uint8_t scale_code) {
    float x = static_cast<float>(std::log2(v) - direct_p::kNvfp4Offset);
    for (int k = 0; k < ulps; ++k) x = std::nextafter(x, -INFINITY);
    for (int k = 0; k < 2 * ulps; ++k, x = std::nextafter(x, INFINITY)) u.push_back(x), sc.push_back(scale_code);
  };
  for (int c = 0; c < 0x7E; ++c) {
    const double mid = 0.5 * (decode(ElemFormat::ue4m3, c) + decode(ElemFormat::ue4m3, c + 1));
    if (6.0 * mid <= 256.0) around(6.0 * mid, 48, static_cast<std::uint8_t>(c));
  }
  for (int c = 1; c < 0x7F; ++c)
    for (double m : {0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0})
      if (m * decode(ElemFormat::ue4m3, c) <= 256.0) around(m * decode(ElemFormat::ue4m3, c), 24, c);
  std::uniform_real_distribution<float> wide(-24.0f, 0.0f);
  std::uniform_int_distribution<int> any_scale(0, 0x7E);
  for (int k = 0; k < (1 << 18); ++k) u.push_back(wide(rng)), sc.push_back(static_cast<std::uint8_t>(any_scale(rng)));
  for (float x : {-INFINITY, -200.0f, 0.0f}) u.push_back(x), sc.push_back(0), u.push_back(x), sc.push_back(44);
  const int n = static_cast<int>(u.size());
  DeviceArray<float> d_u(u.size());
  DeviceArray<std::uint8_t> d_sc(sc.size());
  DeviceArray<std::uint32_t> d_scale(u.size()), d_code(u.size());
  d_u.upload(u), d_sc.upload(sc);
  p_exp2_helpers_kernel<<<(n + 255) / 256, 256>>>(d_u.ptr, d_sc.ptr, n, d_scale.ptr, d_code.ptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const auto got_scale = d_scale.download(), got_code = d_code.download();
  std::size_t bad_scale = 0, bad_code = 0;
  for (int i = 0; i < n; ++i) {
    const float v = emulator::ex2_for_target(Target::sm90, u[i] + direct_p::kNvfp4Offset);
    bad_scale += got_scale[i] != nvfp4_block_scale_code(v, 1.0f);
    const float sb = decode(ElemFormat::ue4m3, sc[i]);
    const std::uint32_t want = sb > 0.0f ? encode_rne_sat(ElemFormat::e2m1, v / sb) : 0u;
    if (got_code[i] != want && bad_code++ < 5)
      ADD_FAILURE() << std::hexfloat << "u " << u[i] << " v " << v << " s_b " << sb << ": code " << got_code[i]
                    << ", emulator " << want;
  }
  EXPECT_EQ(bad_scale, 0u) << "of " << n;
  EXPECT_EQ(bad_code, 0u) << "of " << n;
}

// The kernel's BF16 operand of P: for every E2M1 code and UE4M3 scale, the
// packed sequence's bits against q·s_b·2^-8 computed on the host (exact in
// bf16; code 1 enters the bf16 multiply as a subnormal).
__global__ void p_value_kernel(std::uint32_t* value) {
  const int code = threadIdx.x, scale_code = blockIdx.x;
  value[scale_code * blockDim.x + code] = sm90::fwd::nvfp4::nvfp4_p_value_bits(code, scale_code);
}

TEST(GpuNvfp4PHelpers, ValuesAreCodeTimesScale) {
  FP4ATTN_REQUIRE_HOPPER();
  constexpr int kCodes = 8, kScales = 128;
  DeviceArray<std::uint32_t> d_value(kCodes * kScales);
  p_value_kernel<<<kScales, kCodes>>>(d_value.ptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const auto got = d_value.download();
  std::size_t bad = 0;
  for (int sc = 0; sc < 0x7F; ++sc)  // 0x7F is UE4M3's NaN
    for (int c = 0; c < kCodes; ++c) {
      const float want =
          decode(ElemFormat::e2m1, c) * decode(ElemFormat::ue4m3, sc) / direct_p::kNvfp4OperandUnscale;
      bad += got[sc * kCodes + c] != (float_bits(want) >> 16) || (float_bits(want) & 0xFFFFu) != 0;
    }
  EXPECT_EQ(bad, 0u);
}

// ---- the BF16 expansion, bit for bit against the emulator's sm90 operands

TEST(GpuNvfp4Expand, OperandsMatchEmulator) {
  FP4ATTN_REQUIRE_HOPPER();
  for (const AttentionShape s : {AttentionShape{2, 3, 3, 300, 77, 128}, AttentionShape{1, 2, 1, 65, 1000, 64},
                                 AttentionShape{1, 1, 1, 5, 17, 64}}) {
    const std::uint32_t seed = gpu_test::fresh_seed();
    std::mt19937 rng(seed);
    const std::string where = "Sq=" + std::to_string(s.Sq) + " Sk=" + std::to_string(s.Sk) + " D=" +
                              std::to_string(s.D) + " seed=" + std::to_string(seed);
    const auto [q, k, v] = random_inputs(s, rng, kOutlier);
    DeviceBf16 dq(q, s.B, s.Sq, s.Hq, s.D), dk(k, s.B, s.Sk, s.Hkv, s.D), dv(v, s.B, s.Sk, s.Hkv, s.D);
    sm90::fwd::Nvfp4Operands ops(s);
    {
      // Poison the BF16 operands: every element the kernel may read must be written.
      const sm90::fwd::Nvfp4ForwardArgs a = ops.forward_args(MaskKind::none, true, 1.0f, false);
      cudaMemset(const_cast<void*>(a.q), 0xFF, s.q_elems() * 2);
      cudaMemset(const_cast<void*>(a.k), 0xFF, s.kv_elems() * 2);
      cudaMemset(const_cast<void*>(a.vt), 0xFF, s.B * s.Hkv * s.D * a.vt_keys * 2);
    }
    ops.prepare(dq.view, dk.view, dv.view, false, 1.0f, nullptr);
    ops.check_finite(nullptr);
    const sm90::fwd::Nvfp4ForwardArgs a = ops.forward_args(MaskKind::none, true, 1.0f, false);
    ASSERT_EQ(a.vt_keys, cq::fp4_padded_tokens(s.Sk));
    const auto got_q = download_bf16(a.q, s.q_elems());
    const auto got_k = download_bf16(a.k, s.kv_elems());
    const auto got_vt = download_bf16(a.vt, s.B * s.Hkv * s.D * a.vt_keys);

    const QuantizedTensor tq = quantize(q, s.B, s.Sq, s.Hq, s.D, TensorFormat::nvfp4, BlockAxis::along_d, {}, "q");
    const QuantizedTensor tk = quantize(k, s.B, s.Sk, s.Hkv, s.D, TensorFormat::nvfp4, BlockAxis::along_d, {}, "k");
    const QuantizedTensor tv = quantize(v, s.B, s.Sk, s.Hkv, s.D, TensorFormat::nvfp4, BlockAxis::along_s, {}, "v");
    const emulator::QkOperand want_q = emulator::qk_operand(tq, Target::sm90, 1);
    const emulator::QkOperand want_k = emulator::qk_operand(tk, Target::sm90, 128);
    const emulator::VOperand want_v = emulator::v_operand(tv, Target::sm90);
    // The tensor scales stay outside the operands: the emulator's factors are their reciprocals.
    EXPECT_EQ(1.0f / download_float(a.q_tensor_scale), want_q.row_factor[0]) << where;
    EXPECT_EQ(1.0f / download_float(a.k_tensor_scale), want_k.row_factor[0]) << where;
    EXPECT_EQ(1.0f / download_float(a.v_tensor_scale), want_v.col_factor[0]) << where;

    std::size_t bad = 0, nonzero = 0;
    for (std::size_t i = 0; i < got_q.size(); ++i) bad += !(got_q[i] == want_q.values[i]);  // both (B, H, S, D)
    for (std::size_t i = 0; i < got_k.size(); ++i) bad += !(got_k[i] == want_k.values[i]);
    for (std::int64_t bh = 0; bh < s.B * s.Hkv; ++bh)
      for (std::int64_t d = 0; d < s.D; ++d)
        for (std::int64_t key = 0; key < a.vt_keys; ++key) {
          const float got = got_vt[(bh * s.D + d) * a.vt_keys + key];
          const float want = key < s.Sk ? want_v.values[(bh * s.Sk + key) * s.D + d] : 0.0f;
          bad += !(got == want);
          nonzero += got != 0.0f;
        }
    EXPECT_EQ(bad, 0u) << where;
    EXPECT_GT(nonzero, 0u) << where;
  }
}

// ---- the forward against the emulator

struct GpuResult {
  std::vector<float> o, lse;
};

GpuResult run_gpu(const Nvfp4Case& c, const std::vector<float>& q, const std::vector<float>& k,
                  const std::vector<float>& v) {
  const AttentionShape& s = c.shape;
  DeviceBf16 dq(q, s.B, s.Sq, s.Hq, s.D), dk(k, s.B, s.Sk, s.Hkv, s.D), dv(v, s.B, s.Sk, s.Hkv, s.D);
  const float scale = 1.0f / std::sqrt(static_cast<float>(s.D));
  sm90::fwd::Nvfp4Operands ops(s);
  ops.prepare(dq.view, dk.view, dv.view, c.smooth_k, scale, nullptr);
  ops.check_finite(nullptr);

  DeviceArray<__nv_bfloat16> o(static_cast<std::size_t>(s.q_elems()));
  DeviceArray<float> lse(s.lse_elems());
  o.poison();
  lse.poison();
  sm90::fwd::Nvfp4ForwardArgs a = ops.forward_args(c.mask, c.direct_p, scale, c.smooth_k);
  a.o = o.ptr, a.o_stride_b = s.Sq * s.Hq * s.D, a.o_stride_s = s.Hq * s.D, a.o_stride_h = s.D;
  a.lse = lse.ptr;
  a.window_left = static_cast<int>(c.window.left), a.window_right = static_cast<int>(c.window.right);
  sm90::fwd::forward_nvfp4(a, nullptr);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  GpuResult r;
  const auto o_raw = o.download();
  r.o.resize(o_raw.size());
  for (std::size_t i = 0; i < o_raw.size(); ++i) r.o[i] = __bfloat162float(o_raw[i]);
  r.lse = lse.download();
  return r;
}

emulator::ForwardResult run_emulator(const Nvfp4Case& c, const std::vector<float>& q, const std::vector<float>& k,
                                     const std::vector<float>& v) {
  AttentionOptions opt;
  opt.recipe = Recipe::nvfp4;
  opt.mask = c.mask;
  opt.direct_p = c.direct_p;
  opt.smooth_k = c.smooth_k;
  opt.window = c.window;
  opt.target = Target::sm90;
  return emulator::forward(c.shape, q, k, v, opt);
}

// The forward bounds of forward_check.hpp without its bit-exactness clause
// (the BF16 tensor core's sums are not modelled): every output written,
// non-finite values and fully masked rows where the emulator has them, O
// within rel L2, finite LSE within the absolute bound.
void expect_matches_emulator(const GpuResult& got, const emulator::ForwardResult& want, const std::string& where) {
  std::size_t unwritten = 0;
  for (float x : got.o) unwritten += std::isnan(x);
  for (float x : got.lse) unwritten += std::isnan(x);
  ASSERT_EQ(unwritten, 0u) << "outputs left as poison " << where;
  const ErrorMetrics m = compare(got.o, want.o);
  EXPECT_EQ(m.nonfinite_mismatch, 0) << where;
  EXPECT_LE(m.rel_l2, kMaxRelL2) << "O rel L2 " << where;
  double max_lse = 0.0;
  std::size_t inf_mismatch = 0, masked_rows = 0, o_differ = 0;
  for (std::size_t i = 0; i < got.lse.size(); ++i) {
    if (std::isinf(want.lse[i]) || std::isinf(got.lse[i])) {
      inf_mismatch += got.lse[i] != want.lse[i];
      masked_rows += std::isinf(want.lse[i]);
      continue;
    }
    max_lse = std::max(max_lse, std::fabs(static_cast<double>(got.lse[i]) - want.lse[i]));
  }
  for (std::size_t i = 0; i < got.o.size(); ++i) o_differ += got.o[i] != want.o[i];
  EXPECT_EQ(inf_mismatch, 0u) << "fully masked rows differ " << where;
  EXPECT_LE(max_lse, kMaxLseDiff) << "LSE " << where;
  std::printf("[ nvfp4 stats ] %s: O rel L2 %.3g, O differing %zu of %zu, max |dLSE| %.3g, masked rows %zu\n",
              where.c_str(), m.rel_l2, o_differ, got.o.size(), max_lse, masked_rows);
}

TEST(GpuForwardNvfp4, KnownAnswerZeroScoresUnitValues) {
  FP4ATTN_REQUIRE_HOPPER();
  // Q = K = 0, V = 1: every key weighs the same, so O = 1 exactly. P of a zero
  // score is not 2^8 but 6 · 44: s_b = UE4M3(2^8 / 6 = 42.7) = 44 and the
  // code of 2^8 / 44 = 5.8 is 6, so LSE = ln(Sk · 264 / 256). Both P paths
  // (ex2.approx(8) is 256 exactly).
  for (bool direct_p : {true, false}) {
    const Nvfp4Case c{{1, 2, 1, 200, 333, 128}, MaskKind::none, true, false, direct_p};
    const AttentionShape& s = c.shape;
    const std::vector<float> q(s.q_elems(), 0.0f), k(s.kv_elems(), 0.0f), v(s.kv_elems(), 1.0f);
    const GpuResult r = run_gpu(c, q, k, v);
    for (float x : r.o) ASSERT_EQ(x, 1.0f) << "direct_p " << direct_p;
    for (float x : r.lse) ASSERT_NEAR(x, std::log(s.Sk * 264.0 / 256.0), kMaxLseDiff) << "direct_p " << direct_p;
  }
}

TEST(GpuForwardNvfp4, NonFiniteInputPoisonsOutputs) {
  FP4ATTN_REQUIRE_HOPPER();
  const AttentionShape s{1, 2, 2, 130, 140, 64};
  std::mt19937 rng(gpu_test::fresh_seed());
  auto [q, k, v] = random_inputs(s, rng);
  q[77] = NAN;
  DeviceBf16 dq(q, s.B, s.Sq, s.Hq, s.D), dk(k, s.B, s.Sk, s.Hkv, s.D), dv(v, s.B, s.Sk, s.Hkv, s.D);
  sm90::fwd::Nvfp4Operands ops(s);
  ops.prepare(dq.view, dk.view, dv.view, false, 0.125f, nullptr);
  DeviceArray<__nv_bfloat16> o(static_cast<std::size_t>(s.q_elems()));
  DeviceArray<float> lse(s.lse_elems());
  cudaMemset(o.ptr, 0, o.bytes());
  cudaMemset(lse.ptr, 0, lse.bytes());
  sm90::fwd::Nvfp4ForwardArgs a = ops.forward_args(MaskKind::causal, true, 0.125f, false);
  a.o = o.ptr, a.o_stride_b = s.Sq * s.Hq * s.D, a.o_stride_s = s.Hq * s.D, a.o_stride_h = s.D;
  a.lse = lse.ptr;
  sm90::fwd::forward_nvfp4(a, nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  for (const auto& x : o.download()) ASSERT_TRUE(std::isnan(__bfloat162float(x)));
  for (float x : lse.download()) ASSERT_TRUE(std::isnan(x));
  try {
    ops.check_finite(nullptr);
    FAIL() << "a NaN in q was not reported";
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), "q");
  }
}

TEST(GpuForwardNvfp4, RefusesWhatItDoesNotImplementByName) {
  FP4ATTN_REQUIRE_HOPPER();
  const AttentionShape s{1, 2, 2, 128, 128, 64};
  sm90::fwd::Nvfp4Operands ops(s);
  DeviceArray<__nv_bfloat16> o(static_cast<std::size_t>(s.q_elems()));
  DeviceArray<float> lse(s.lse_elems());
  auto args = [&] {
    sm90::fwd::Nvfp4ForwardArgs a = ops.forward_args(MaskKind::none, true, 0.125f, false);
    a.o = o.ptr, a.o_stride_b = s.Sq * s.Hq * s.D, a.o_stride_s = s.Hq * s.D, a.o_stride_h = s.D;
    a.lse = lse.ptr;
    return a;
  };
  auto expect_refused = [](const sm90::fwd::Nvfp4ForwardArgs& a, const char* argument) {
    try {
      sm90::fwd::forward_nvfp4(a, nullptr);
      ADD_FAILURE() << "accepted a bad " << argument;
    } catch (const Error& e) {
      EXPECT_EQ(e.argument(), argument);
    }
  };
  auto a = args();
  a.D = 96;
  expect_refused(a, "D");
  a = args();
  a.Hkv = 3;
  expect_refused(a, "Hkv");
  a = args();
  a.vt_keys = 100;
  expect_refused(a, "vt");
  a = args();
  a.window_left = -2;
  expect_refused(a, "window_left");
  a = args();
  a.window_right = -5;
  expect_refused(a, "window_right");
}

// ---- dispatch: the public entry point and the zero-copy device path run recipe nvfp4 here

// Recipe nvfp4, causal, smooth_k: the options of the entry-point tests below.
AttentionOptions causal_smooth_k_options() {
  AttentionOptions opt;
  opt.recipe = Recipe::nvfp4;
  opt.mask = MaskKind::causal;
  opt.smooth_k = true;
  return opt;
}

TEST(GpuForwardNvfp4, PublicApiRunsNvfp4OnSm90) {
  FP4ATTN_REQUIRE_HOPPER();
  const AttentionShape s{1, 4, 2, 190, 260, 128};
  const std::uint32_t seed = gpu_test::fresh_seed();
  std::mt19937 rng(seed);
  const auto [q, k, v] = random_inputs(s, rng);
  AttentionOptions opt = causal_smooth_k_options();
  const ForwardOutput got = forward(s, q, k, v, opt, Executor::automatic);
  EXPECT_EQ(got.executor, Executor::sm90);
  expect_matches_emulator({got.o, got.lse}, emulator::forward(s, q, k, v, opt),
                          "public API seed=" + std::to_string(seed));
  // The exp2 baseline runs on the GPU too.
  opt.direct_p = false;
  const ForwardOutput exp2 = forward(s, q, k, v, opt, Executor::automatic);
  EXPECT_EQ(exp2.executor, Executor::sm90);
  expect_matches_emulator({exp2.o, exp2.lse}, emulator::forward(s, q, k, v, opt),
                          "public API, exp2, seed=" + std::to_string(seed));
}

// (B, H, S, D) storage of a (B, S, H, D) tensor's bf16 values on the device,
// which device_path_differences sees as (B, S, H, D) through strides.
std::unique_ptr<DeviceArray<__nv_bfloat16>> heads_first(const std::vector<float>& x, std::int64_t B, std::int64_t S,
                                                        std::int64_t H, std::int64_t D) {
  std::vector<__nv_bfloat16> h(x.size());
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t t = 0; t < S; ++t)
      for (std::int64_t hh = 0; hh < H; ++hh)
        for (std::int64_t d = 0; d < D; ++d)
          h[((b * H + hh) * S + t) * D + d] = __float2bfloat16_rn(x[((b * S + t) * H + hh) * D + d]);
  auto dev = std::make_unique<DeviceArray<__nv_bfloat16>>(x.size());
  dev->upload(h);
  return dev;
}

// The zero-copy device path (dispatch::sm90_forward_device) on strided bf16
// views of q, k and v, against `want` bit for bit: how many O and LSE
// elements differ. Outputs and workspace are poisoned first.
std::size_t device_path_differences(const AttentionShape& s, const AttentionOptions& opt, const std::vector<float>& q,
                                    const std::vector<float>& k, const std::vector<float>& v,
                                    const ForwardOutput& want) {
  const auto dq = heads_first(q, s.B, s.Sq, s.Hq, s.D);
  const auto dk = heads_first(k, s.B, s.Sk, s.Hkv, s.D);
  const auto dv = heads_first(v, s.B, s.Sk, s.Hkv, s.D);
  DeviceArray<__nv_bfloat16> o(static_cast<std::size_t>(s.q_elems()));
  DeviceArray<float> lse(s.lse_elems());
  DeviceArray<unsigned char> workspace(dispatch::sm90_device_workspace_bytes(s, Recipe::nvfp4));
  o.poison();
  lse.poison();
  workspace.poison();
  dispatch::DeviceForwardArgs a;
  a.shape = s;
  a.element = dispatch::DeviceElement::bf16;
  a.q = {dq->ptr, s.Hq * s.Sq * s.D, s.D, s.Sq * s.D};
  a.k = {dk->ptr, s.Hkv * s.Sk * s.D, s.D, s.Sk * s.D};
  a.v = {dv->ptr, s.Hkv * s.Sk * s.D, s.D, s.Sk * s.D};
  a.o = o.ptr;
  a.o_stride_b = s.Sq * s.Hq * s.D, a.o_stride_s = s.Hq * s.D, a.o_stride_h = s.D;
  a.lse = lse.ptr;
  a.workspace = workspace.ptr;
  a.workspace_bytes = workspace.bytes();
  dispatch::sm90_forward_device(a, opt, nullptr);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const auto o_raw = o.download();
  const auto got_lse = lse.download();
  std::size_t differ = 0;
  for (std::size_t i = 0; i < o_raw.size(); ++i) differ += !(__bfloat162float(o_raw[i]) == want.o[i]);
  for (std::size_t i = 0; i < got_lse.size(); ++i) differ += !(got_lse[i] == want.lse[i]);
  return differ;
}

// A window on the public entry point and the zero-copy path (strided views):
// both run on sm90 (no host copy), match the emulator and agree bit for bit.
TEST(GpuForwardNvfp4, WindowsRunOnSm90) {
  FP4ATTN_REQUIRE_HOPPER();
  const AttentionShape s{2, 4, 2, 400, 650, 128};
  const std::uint32_t seed = gpu_test::fresh_seed();
  std::mt19937 rng(seed);
  const auto [q, k, v] = random_inputs(s, rng);
  AttentionOptions opt = causal_smooth_k_options();
  opt.window = {150, 0};
  const ForwardOutput got = forward(s, q, k, v, opt, Executor::automatic);
  EXPECT_EQ(got.executor, Executor::sm90);
  expect_matches_emulator({got.o, got.lse}, emulator::forward(s, q, k, v, opt),
                          "public API, window 150, seed=" + std::to_string(seed));
  // The window is honoured: the unwindowed answer lies far outside the bound
  // the windowed one meets (rel L2 0.12 on the H200's first run).
  AttentionOptions full = opt;
  full.window = {};
  EXPECT_GT(compare(got.o, emulator::forward(s, q, k, v, full).o).rel_l2, 10 * kMaxRelL2);

  EXPECT_EQ(device_path_differences(s, opt, q, k, v, got), 0u);
}

TEST(GpuForwardNvfp4, DevicePathMatchesHostPath) {
  FP4ATTN_REQUIRE_HOPPER();
  // Strided bf16 views (heads-first storage) against the host path's
  // contiguous fp32 upload of the same bf16 values: the same codes, so the
  // same outputs bit for bit.
  const AttentionShape s{2, 4, 2, 150, 333, 64};
  std::mt19937 rng(gpu_test::fresh_seed());
  const auto [q, k, v] = random_inputs(s, rng);
  AttentionOptions opt = causal_smooth_k_options();
  const ForwardOutput host = forward(s, q, k, v, opt, Executor::sm90);

  EXPECT_EQ(device_path_differences(s, opt, q, k, v, host), 0u);
}

class GpuForwardNvfp4Grid : public ::testing::TestWithParam<Nvfp4Case> {};

TEST_P(GpuForwardNvfp4Grid, MatchesEmulator) {
  FP4ATTN_REQUIRE_HOPPER();
  const Nvfp4Case& c = GetParam();
  const std::uint32_t seed = gpu_test::fresh_seed();
  std::mt19937 rng(seed);
  const AttentionShape& s = c.shape;
  const float outlier = c.outliers ? kOutlier : 1.0f;
  const auto [q, k, v] = random_inputs(s, rng, outlier);
  const GpuResult got = run_gpu(c, q, k, v);
  expect_matches_emulator(got, run_emulator(c, q, k, v),
                          case_name(::testing::TestParamInfo<Nvfp4Case>(c, 0)) + " seed=" + std::to_string(seed));
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, GpuForwardNvfp4Grid,
    ::testing::Values(Nvfp4Case{{1, 2, 2, 128, 128, 128}, MaskKind::none, false},
                      Nvfp4Case{{1, 2, 2, 128, 128, 64}, MaskKind::none, true},
                      Nvfp4Case{{2, 4, 2, 200, 333, 64}, MaskKind::causal, true},    // GQA, odd lengths, Sq < Sk
                      Nvfp4Case{{2, 4, 2, 200, 333, 128}, MaskKind::causal, false},
                      Nvfp4Case{{1, 2, 1, 300, 150, 128}, MaskKind::causal, false},  // Sq > Sk: fully masked rows
                      Nvfp4Case{{1, 2, 2, 100, 17, 64}, MaskKind::causal, true},     // Sk < one key tile and one V pad
                      Nvfp4Case{{1, 3, 1, 77, 515, 128}, MaskKind::causal, true},    // MQA
                      Nvfp4Case{{2, 2, 2, 513, 1000, 64}, MaskKind::none, false, true},
                      Nvfp4Case{{1, 4, 2, 256, 512, 128}, MaskKind::none, true, true},
                      Nvfp4Case{{1, 4, 4, 1024, 1024, 128}, MaskKind::causal, true, true},
                      Nvfp4Case{{1, 2, 2, 1, 1, 64}, MaskKind::none, true},
                      Nvfp4Case{{1, 2, 2, 129, 257, 128}, MaskKind::causal_top_left, true},
                      Nvfp4Case{{1, 2, 2, 129, 257, 64}, MaskKind::causal_top_left, false},
                      // The exp2 baseline (Direct-P off) over the same kinds of shapes.
                      Nvfp4Case{{1, 2, 2, 128, 128, 128}, MaskKind::none, false, false, false},
                      Nvfp4Case{{2, 4, 2, 200, 333, 64}, MaskKind::causal, true, false, false},
                      Nvfp4Case{{1, 2, 1, 300, 150, 128}, MaskKind::causal, false, false, false},
                      Nvfp4Case{{1, 2, 2, 100, 17, 64}, MaskKind::causal, true, false, false},
                      Nvfp4Case{{2, 2, 2, 513, 1000, 64}, MaskKind::none, false, true, false},
                      Nvfp4Case{{1, 4, 4, 1024, 1024, 128}, MaskKind::causal, true, true, false},
                      Nvfp4Case{{1, 2, 2, 1, 1, 64}, MaskKind::none, true, false, false},
                      Nvfp4Case{{1, 2, 2, 129, 257, 128}, MaskKind::causal_top_left, true, false, false}),
    case_name);

// Sliding windows: the CTA's key tiles start at the first its rows see, and
// tiles that cross either edge are masked (the E4M3 kernel's grid has the
// same kinds): narrower than a tile and wider than several, one-sided and
// two-sided, Sq ≠ Sk, rows that see nothing, both head dims, both P paths.
INSTANTIATE_TEST_SUITE_P(
    Windows, GpuForwardNvfp4Grid,
    ::testing::Values(Nvfp4Case{{1, 2, 2, 1024, 1024, 128}, MaskKind::causal, true, false, true, {256, -1}},
                      Nvfp4Case{{1, 2, 2, 1024, 1024, 128}, MaskKind::causal, true, false, false, {256, -1}},
                      Nvfp4Case{{2, 4, 2, 700, 900, 128}, MaskKind::causal, true, false, true, {5, -1}},
                      Nvfp4Case{{2, 4, 2, 700, 900, 64}, MaskKind::none, true, true, true, {100, 37}},
                      Nvfp4Case{{1, 2, 1, 900, 300, 128}, MaskKind::none, false, false, true, {0, 200}},
                      Nvfp4Case{{1, 2, 1, 600, 300, 64}, MaskKind::causal, true, false, true, {130, 0}},
                      Nvfp4Case{{1, 2, 2, 500, 300, 128}, MaskKind::causal_top_left, true, false, true, {64, -1}},
                      Nvfp4Case{{1, 2, 2, 333, 1500, 64}, MaskKind::none, true, false, false, {-1, 10}},
                      Nvfp4Case{{1, 4, 4, 1024, 1024, 64}, MaskKind::none, false, false, true, {300, 300}}),
    case_name);

}  // namespace
}  // namespace fp4attn
