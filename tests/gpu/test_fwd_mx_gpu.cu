// GPU suites for recipes mxfp4_train and mxfp4 on sm90: the fold of the MXFP4
// quantizer's output into E4M3 against the emulator's sm90 operands, then the
// FP8 forward kernel over folded operands against emulator::forward (target
// sm90, same inputs): known answer, random shapes with odd lengths, GQA,
// bottom-right causal with Sq ≠ Sk, smooth_k on and off, Direct-P on and off,
// both head dims, and inputs whose 32-element blocks span
// more binades than the fold window, so that some blocks round to E4M3
// subnormals or vanish.
#include <cmath>
#include <cstring>
#include <string>
#include <utility>

#include "cuda/quantize/fold_mx.hpp"
#include "cuda/quantize/fold_table.hpp"
#include "cuda/quantize/quantize_fp4.hpp"
#include "cuda/sm90/fwd/fwd.hpp"
#include "cuda/sm90/fwd/mx_operands.hpp"
#include "emulator/operands.hpp"
#include "fp4attn/attention.hpp"
#include "fp4attn/emulator.hpp"
#include "fp4attn/error.hpp"
#include "fp4attn/formats.hpp"
#include "fp4attn/metrics.hpp"
#include "fp4attn/quantize.hpp"
#include "gpu/forward_check.hpp"
#include "gpu/gpu_test_util.hpp"

namespace fp4attn {
namespace {

using gpu_test::DeviceArray;
namespace cq = cuda_quantize;

constexpr double kMaxRelL2 = gpu_test::kForwardMaxRelL2;  // the fp8 grid's bounds
constexpr double kMaxLseDiff = gpu_test::kForwardMaxLseDiff;

// Block-scale outliers: a 32-element block (along D for Q and K; 32 tokens of
// one channel group for V) scaled by 2^kLow (out of the fold window: rounds to
// zero), 2^kEdge (partly subnormal in E4M3) or 2^kHigh (sets the group's R).
constexpr int kLow = -20, kEdge = -11, kHigh = 5;

struct MxCase {
  Recipe recipe;
  AttentionShape shape;
  MaskKind mask;
  bool direct_p;
  bool smooth_k;
  bool block_outliers = false;
  int consumers = 0;  // Fp8ForwardArgs::consumers of the fold-pass kernel (0: the launcher's choice)
  Window window{};    // a sliding window (none by default)
};

std::string case_name(const ::testing::TestParamInfo<MxCase>& info) {
  const MxCase& c = info.param;
  const auto bound = [](std::int64_t b) { return b < 0 ? std::string("inf") : std::to_string(b); };
  return std::string(to_string(c.recipe)) + "_" + gpu_test::shape_mask_name(c.shape, c.mask) +
         (c.direct_p ? "_directp" : "_exp2") + (c.smooth_k ? "_smoothk" : "") +
         (c.block_outliers ? "_blockoutliers" : "") + (c.consumers != 0 ? "_" + std::to_string(c.consumers) + "consumers" : "") +
         (c.window.bounded() ? "_window" + bound(c.window.left) + "_" + bound(c.window.right) : "");
}

// attention_input, then whole blocks scaled by powers of two. token_block is
// the tokens one block spans (1 for Q and K, 32 for V).
std::vector<float> mx_input(std::int64_t B, std::int64_t S, std::int64_t H, std::int64_t D, float offset_scale,
                            bool block_outliers, std::int64_t token_block, std::mt19937& rng) {
  std::vector<float> x = gpu_test::attention_input(static_cast<std::size_t>(B * S * H * D), D, offset_scale, rng);
  if (!block_outliers) return x;
  std::uniform_real_distribution<float> unit(0.0f, 1.0f);
  const std::int64_t sblocks = (S + token_block - 1) / token_block, dblocks = D / kMxfp4Block;
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t h = 0; h < H; ++h)
      for (std::int64_t sb = 0; sb < sblocks; ++sb)
        for (std::int64_t db = 0; db < dblocks; ++db) {
          const float r = unit(rng);
          const int e = r < 0.06f ? kLow : r < 0.12f ? kEdge : r < 0.15f ? kHigh : 0;
          if (e == 0) continue;
          for (std::int64_t s = sb * token_block; s < std::min(S, (sb + 1) * token_block); ++s)
            for (std::int64_t d = db * kMxfp4Block; d < (db + 1) * kMxfp4Block; ++d) {
              float& v = x[((b * S + s) * H + h) * D + d];
              v = gpu_test::round_bf16(v * exp2i(e));
            }
        }
  return x;
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

// ---- the fold alone, bit for bit against the emulator's sm90 operands

struct FoldCase {
  std::int64_t B, S, H, D;
};

TEST(GpuFoldMx, QkAndVMatchEmulatorOperands) {
  FP4ATTN_REQUIRE_HOPPER();
  for (const FoldCase fc : {FoldCase{2, 300, 3, 128}, FoldCase{1, 77, 2, 64}, FoldCase{1, 1000, 1, 64}}) {
    const std::uint32_t seed = gpu_test::fresh_seed();
    std::mt19937 rng(seed);
    const std::string where = "S=" + std::to_string(fc.S) + " D=" + std::to_string(fc.D) + " seed=" + std::to_string(seed);
    const std::int64_t B = fc.B, S = fc.S, H = fc.H, D = fc.D;
    const std::vector<float> x = mx_input(B, S, H, D, 1.0f, true, 1, rng);
    const std::vector<float> xv = mx_input(B, S, H, D, 1.0f, true, kMxfp4Block, rng);
    DeviceBf16 dx(x, B, S, H, D), dv(xv, B, S, H, D);

    cq::Fp4Buffers bufs;
    const cq::Fp4Sizes zq = cq::fp4_sizes(cq::Fp4Operand::q, TensorFormat::mxfp4, B, S, H, D);
    const cq::Fp4Sizes zv = cq::fp4_sizes(cq::Fp4Operand::v, TensorFormat::mxfp4, B, S, H, D);
    DeviceArray<std::uint8_t> q_codes(zq.code_bytes), q_scales(zq.scale_bytes), v_codes(zv.code_bytes),
        v_scales(zv.scale_bytes);
    DeviceArray<int> flags(3);
    cudaMemset(flags.ptr, 0, flags.bytes());
    bufs.q = {q_codes.ptr, q_scales.ptr, nullptr};
    bufs.v = {v_codes.ptr, v_scales.ptr, nullptr};
    bufs.nonfinite = flags.ptr;
    cq::Fp4Options opt;
    cq::quantize_fp4(dx.view, cq::Fp4Operand::q, opt, bufs, nullptr);
    cq::quantize_fp4(dv.view, cq::Fp4Operand::v, opt, bufs, nullptr);

    const std::int64_t tiles = (S + 127) / 128, vt_keys = cq::padded_keys(S);
    DeviceArray<std::uint8_t> rows(B * S * H * D), tiled(B * S * H * D), vt(B * H * D * vt_keys),
        tiled_t(B * H * D * vt_keys);
    DeviceArray<float> row_f(B * H * S), tile_f(B * H * tiles), v_f(B * H * D);
    for (auto* a : {&rows, &tiled, &vt, &tiled_t}) a->poison();
    for (auto* a : {&row_f, &tile_f, &v_f}) a->poison();
    cq::fold_mx_qk(bufs.q, B, S, H, D, 1, rows.ptr, row_f.ptr, nullptr);
    cq::fold_mx_qk(bufs.q, B, S, H, D, 128, tiled.ptr, tile_f.ptr, nullptr, tiled_t.ptr);
    cq::fold_mx_v(bufs.v, B, S, H, D, vt_keys, vt.ptr, v_f.ptr, nullptr);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);

    const QuantizedTensor tq = quantize(x, B, S, H, D, TensorFormat::mxfp4, BlockAxis::along_d, {}, "q");
    const QuantizedTensor tv = quantize(xv, B, S, H, D, TensorFormat::mxfp4, BlockAxis::along_s, {}, "v");
    const emulator::QkOperand want_rows = emulator::qk_operand(tq, Target::sm90, 1);
    const emulator::QkOperand want_tiled = emulator::qk_operand(tq, Target::sm90, 128);
    const emulator::VOperand want_v = emulator::v_operand(tv, Target::sm90);
    const auto got_rows = rows.download(), got_tiled = tiled.download(), got_vt = vt.download();
    const auto got_tiled_t = tiled_t.download();
    const auto got_row_f = row_f.download(), got_tile_f = tile_f.download(), got_v_f = v_f.download();

    std::size_t bad_values = 0, bad_factors = 0, subnormal_or_zero = 0, bad_transposed = 0;
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t h = 0; h < H; ++h) {
        for (std::int64_t s = 0; s < S; ++s) {
          const std::int64_t r = want_rows.row(b, h, s);
          bad_factors += got_row_f[r] != want_rows.row_factor[r];
          bad_factors += got_tile_f[(b * H + h) * tiles + s / 128] != want_tiled.row_factor[r];
          for (std::int64_t d = 0; d < D; ++d) {
            const std::int64_t at = ((b * S + s) * H + h) * D + d;
            const float a = decode(ElemFormat::e4m3, got_rows[at]), t = decode(ElemFormat::e4m3, got_tiled[at]);
            bad_values += !(a == want_rows.values[r * D + d]) + !(t == want_tiled.values[r * D + d]);
            subnormal_or_zero += (got_tiled[at] & 0x78) == 0 && x[at] != 0.0f;
          }
        }
        for (std::int64_t d = 0; d < D; ++d) {
          bad_factors += got_v_f[(b * H + h) * D + d] != want_v.col_factor[(b * H + h) * D + d];
          for (std::int64_t key = 0; key < vt_keys; ++key) {
            const std::int64_t group = key / cq::kVtKeyGroup, slot = key % cq::kVtKeyGroup;
            const std::int64_t token = group * cq::kVtKeyGroup + cq::vt_key_of_slot(static_cast<int>(slot));
            const float want = token < S ? want_v.values_of(b, h, token)[d] : 0.0f;
            bad_values += !(decode(ElemFormat::e4m3, got_vt[((b * H + h) * D + d) * vt_keys + key]) == want);
            // The transposed copy of the tiled fold (the backward's Kᵀ / Qᵀ): the same bytes, zero past S.
            const std::uint8_t want_t = token < S ? got_tiled[((b * S + token) * H + h) * D + d] : 0;
            bad_transposed += got_tiled_t[((b * H + h) * D + d) * vt_keys + key] != want_t;
          }
        }
      }
    EXPECT_EQ(bad_values, 0u) << where;
    EXPECT_EQ(bad_factors, 0u) << where;
    EXPECT_EQ(bad_transposed, 0u) << where;
    EXPECT_GT(subnormal_or_zero, 0u) << "the input must push some blocks out of the fold window " << where;
  }
}

// mx_lse_shift bit for bit: softmax_scale · Σ_d fl(q[d] · k̄[d]) summed in d
// order over Q's MXFP4 values (emulator::smooth_k_shift's rule), on blocks
// from both ends of the E8M0 range, GQA, both head dims.
TEST(GpuFoldMx, LseShiftIsTheCpuSumBitForBit) {
  FP4ATTN_REQUIRE_HOPPER();
  for (const auto& [S, D] : {std::pair<std::int64_t, std::int64_t>{300, 128}, {77, 64}}) {
    const std::uint32_t seed = gpu_test::fresh_seed();
    std::mt19937 rng(seed);
    const std::int64_t B = 2, Hq = 4, Hkv = 2;
    const std::string where = "S=" + std::to_string(S) + " D=" + std::to_string(D) + " seed=" + std::to_string(seed);
    std::vector<float> x = mx_input(B, S, Hq, D, 1.0f, true, 1, rng);
    std::uniform_real_distribution<float> unit(0.0f, 1.0f);
    std::size_t extreme_blocks = 0;
    for (std::size_t first = 0; first < x.size(); first += kMxfp4Block) {
      const float r = unit(rng);
      const int e = r < 0.05f ? -120 : r < 0.10f ? 100 : 0;  // scales near 2^-127 and 2^98
      if (e == 0) continue;
      ++extreme_blocks;
      for (std::size_t i = first; i < first + kMxfp4Block; ++i) x[i] = gpu_test::round_bf16(x[i] * exp2i(e));
    }
    std::normal_distribution<float> normal(0.0f, 2.0f);
    std::vector<float> mean(static_cast<std::size_t>(B * Hkv * D));
    for (float& m : mean) m = normal(rng);
    DeviceBf16 dq(x, B, S, Hq, D);
    const cq::Fp4Sizes zq = cq::fp4_sizes(cq::Fp4Operand::q, TensorFormat::mxfp4, B, S, Hq, D);
    DeviceArray<std::uint8_t> q_codes(zq.code_bytes), q_scales(zq.scale_bytes);
    DeviceArray<int> flags(3);
    DeviceArray<float> k_mean(mean.size()), shift(static_cast<std::size_t>(B * Hq * S));
    cudaMemset(flags.ptr, 0, flags.bytes());
    k_mean.upload(mean);
    shift.poison();
    cq::Fp4Buffers bufs;
    bufs.q = {q_codes.ptr, q_scales.ptr, nullptr};
    bufs.nonfinite = flags.ptr;
    cq::quantize_fp4(dq.view, cq::Fp4Operand::q, cq::Fp4Options{}, bufs, nullptr);
    const float softmax_scale = 0.0883883f;
    cq::mx_lse_shift(bufs.q, B, S, Hq, Hkv, D, k_mean.ptr, softmax_scale, shift.ptr, nullptr);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const std::vector<float> got = shift.download();

    const QuantizedTensor tq = quantize(x, B, S, Hq, D, TensorFormat::mxfp4, BlockAxis::along_d, {}, "q");
    std::size_t bad = 0, nonzero = 0;
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t h = 0; h < Hq; ++h)
        for (std::int64_t s = 0; s < S; ++s) {
          const float* m = &mean[static_cast<std::size_t>((b * Hkv + h / (Hq / Hkv)) * D)];
          float dot = 0.0f;
          for (std::int64_t d = 0; d < D; ++d) {
            volatile float product = tq.value(b, s, h, d) * m[d];  // rounded before the add, as on the GPU
            dot += product;
          }
          const float want = softmax_scale * dot;
          const float g = got[static_cast<std::size_t>((b * Hq + h) * S + s)];
          bad += std::memcmp(&g, &want, sizeof(float)) != 0;
          nonzero += want != 0.0f;
        }
    EXPECT_EQ(bad, 0u) << "rows whose shift differs in any bit " << where;
    EXPECT_GT(nonzero, static_cast<std::size_t>(B * Hq * S / 2)) << where;
    EXPECT_GT(extreme_blocks, 0u) << where;
  }
}

// The device's fold_table (cvt-based below the fast window) equals the host's
// (encode_rne_sat per magnitude) for every pair of E8M0 block and group exponents.
__global__ void fold_tables_kernel(cq::FoldTable* out) {
  const int e = static_cast<int>(blockIdx.x) - kE8M0Bias, r = static_cast<int>(threadIdx.x) - kE8M0Bias;
  out[blockIdx.x * blockDim.x + threadIdx.x] = cq::fold_table(e, r);
}

TEST(GpuFoldMx, DeviceFoldTableEqualsHostForEveryExponentPair) {
  FP4ATTN_REQUIRE_HOPPER();
  constexpr int kExponents = 255;  // E8M0 codes 0 .. 254 (255 is NaN)
  DeviceArray<cq::FoldTable> tables(kExponents * kExponents);
  fold_tables_kernel<<<kExponents, kExponents>>>(tables.ptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const auto got = tables.download();
  std::size_t differ = 0, slow = 0;
  for (int i = 0; i < kExponents; ++i)
    for (int j = 0; j < kExponents; ++j) {
      const cq::FoldTable want = cq::fold_table(i - kE8M0Bias, j - kE8M0Bias);
      const cq::FoldTable& g = got[i * kExponents + j];
      differ += g.lo != want.lo || g.hi != want.hi;
      slow += (i - j + cq::kFoldHeadroom) < -5;
    }
  EXPECT_EQ(differ, 0u);
  EXPECT_GT(slow, 10000u) << "the pairs must include many below the fast window";
}

// ---- the forward against the emulator

struct GpuResult {
  std::vector<float> o, lse;
};

GpuResult run_gpu(const MxCase& c, const std::vector<float>& q, const std::vector<float>& k,
                  const std::vector<float>& v,
                  sm90::fwd::Fp4Expansion expansion = sm90::fwd::Fp4Expansion::fold_pass) {
  const AttentionShape& s = c.shape;
  DeviceBf16 dq(q, s.B, s.Sq, s.Hq, s.D), dk(k, s.B, s.Sk, s.Hkv, s.D), dv(v, s.B, s.Sk, s.Hkv, s.D);
  const float scale = 1.0f / std::sqrt(static_cast<float>(s.D));
  sm90::fwd::MxOperands ops(s, c.recipe, MxScaleRule::round_up, expansion);
  ops.prepare(dq.view, dk.view, dv.view, c.smooth_k, scale, nullptr);
  ops.check_finite(nullptr);

  DeviceArray<__nv_bfloat16> o(static_cast<std::size_t>(s.q_elems()));
  DeviceArray<float> lse(s.lse_elems());
  o.poison();
  lse.poison();
  sm90::fwd::Fp8ForwardArgs a = ops.forward_args(c.mask, c.direct_p, scale, c.smooth_k);
  a.o = o.ptr, a.o_stride_b = a.q_stride_b, a.o_stride_s = a.q_stride_s, a.o_stride_h = a.q_stride_h;
  a.lse = lse.ptr;
  if (expansion == sm90::fwd::Fp4Expansion::fold_pass) a.consumers = c.consumers;  // the expansion runs two
  a.window_left = static_cast<int>(c.window.left), a.window_right = static_cast<int>(c.window.right);
  sm90::fwd::forward_fp8(a, nullptr);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  GpuResult r;
  const auto o_raw = o.download();
  r.o.resize(o_raw.size());
  for (std::size_t i = 0; i < o_raw.size(); ++i) r.o[i] = __bfloat162float(o_raw[i]);
  r.lse = lse.download();
  return r;
}

void check_against_emulator(const MxCase&, const GpuResult& got, const emulator::ForwardResult& want,
                            const std::string& where) {
  gpu_test::expect_forward_matches_emulator(got.o, got.lse, want, "mx", where);
}

std::string describe(const MxCase& c, std::uint32_t seed) {
  return case_name(::testing::TestParamInfo<MxCase>(c, 0)) + " seed=" + std::to_string(seed);
}

emulator::ForwardResult run_emulator(const MxCase& c, const std::vector<float>& q, const std::vector<float>& k,
                                     const std::vector<float>& v) {
  AttentionOptions opt;
  opt.recipe = c.recipe;
  opt.mask = c.mask;
  opt.direct_p = c.direct_p;
  opt.smooth_k = c.smooth_k;
  opt.window = c.window;
  opt.target = Target::sm90;
  return emulator::forward(c.shape, q, k, v, opt);
}

TEST(GpuForwardMx, KnownAnswerZeroScoresUnitValues) {
  FP4ATTN_REQUIRE_HOPPER();
  // Q = K = 0, V = 1: every key weighs the same, so O = 1 and LSE = ln Sk.
  for (const Recipe recipe : {Recipe::mxfp4_train, Recipe::mxfp4}) {
    const MxCase c{recipe, {1, 2, 1, 200, 333, 128}, MaskKind::none, true, true};
    const AttentionShape& s = c.shape;
    const std::vector<float> q(s.q_elems(), 0.0f), k(s.kv_elems(), 0.0f), v(s.kv_elems(), 1.0f);
    const GpuResult r = run_gpu(c, q, k, v);
    for (float x : r.o) ASSERT_EQ(x, 1.0f) << to_string(recipe);
    for (float x : r.lse) ASSERT_NEAR(x, std::log(static_cast<double>(s.Sk)), kMaxLseDiff) << to_string(recipe);
  }
}

TEST(GpuForwardMx, PublicApiRunsMxRecipesOnSm90) {
  FP4ATTN_REQUIRE_HOPPER();
  const AttentionShape s{1, 4, 2, 190, 260, 128};
  std::mt19937 rng(gpu_test::fresh_seed());
  const auto q = gpu_test::attention_input(s.q_elems(), s.D, 0.5f, rng);
  const auto k = gpu_test::attention_input(s.kv_elems(), s.D, 3.0f, rng);
  const auto v = gpu_test::attention_input(s.kv_elems(), s.D, 1.0f, rng);
  for (const Recipe recipe : {Recipe::mxfp4_train, Recipe::mxfp4}) {
    AttentionOptions opt;
    opt.recipe = recipe;
    opt.mask = MaskKind::causal;
    const ForwardOutput got = forward(s, q, k, v, opt, Executor::sm90);
    EXPECT_EQ(got.executor, Executor::sm90);
    const emulator::ForwardResult want = emulator::forward(s, q, k, v, opt);
    std::size_t o_differ = 0;
    for (std::size_t i = 0; i < got.o.size(); ++i) o_differ += got.o[i] != want.o[i];
    EXPECT_LE(o_differ, gpu_test::max_differing_o(got.o.size())) << to_string(recipe);
    EXPECT_LE(compare(got.o, want.o).rel_l2, kMaxRelL2) << to_string(recipe);
  }
}

class GpuForwardMxGrid : public ::testing::TestWithParam<MxCase> {};

TEST_P(GpuForwardMxGrid, MatchesEmulator) {
  FP4ATTN_REQUIRE_HOPPER();
  const MxCase& c = GetParam();
  const std::uint32_t seed = gpu_test::fresh_seed();
  std::mt19937 rng(seed);
  const AttentionShape& s = c.shape;
  const auto q = mx_input(s.B, s.Sq, s.Hq, s.D, 0.5f, c.block_outliers, 1, rng);
  const auto k = mx_input(s.B, s.Sk, s.Hkv, s.D, 3.0f, c.block_outliers, 1, rng);
  const auto v = mx_input(s.B, s.Sk, s.Hkv, s.D, 1.0f, c.block_outliers, kMxfp4Block, rng);
  const GpuResult got = run_gpu(c, q, k, v);
  check_against_emulator(c, got, run_emulator(c, q, k, v), describe(c, seed));
  if (c.recipe == Recipe::mxfp4 && s.D <= 128) {
    // The kernel that reads MXFP4 and expands it in its producer warpgroup
    // (D ≤ 128) must hand the tensor cores the fold pass's bytes: O and LSE
    // equal bit for bit (NaN positions included).
    const GpuResult expanded = run_gpu(c, q, k, v, sm90::fwd::Fp4Expansion::in_kernel);
    std::size_t o_differ = 0, lse_differ = 0;
    for (std::size_t i = 0; i < got.o.size(); ++i)
      o_differ += std::memcmp(&got.o[i], &expanded.o[i], sizeof(float)) != 0;
    for (std::size_t i = 0; i < got.lse.size(); ++i)
      lse_differ += std::memcmp(&got.lse[i], &expanded.lse[i], sizeof(float)) != 0;
    EXPECT_EQ(o_differ, 0u) << "in-kernel expansion, " << describe(c, seed);
    EXPECT_EQ(lse_differ, 0u) << "in-kernel expansion, " << describe(c, seed);
  }
}

constexpr Recipe kTrain = Recipe::mxfp4_train, kMx = Recipe::mxfp4;

INSTANTIATE_TEST_SUITE_P(
    Shapes, GpuForwardMxGrid,
    ::testing::Values(
        MxCase{kTrain, {1, 2, 2, 128, 128, 128}, MaskKind::none, true, true},
        MxCase{kTrain, {1, 2, 2, 128, 128, 128}, MaskKind::none, false, false},
        MxCase{kTrain, {2, 4, 2, 200, 333, 64}, MaskKind::causal, true, true},    // GQA, odd lengths, Sq < Sk
        MxCase{kTrain, {2, 4, 2, 200, 333, 64}, MaskKind::causal, false, true},
        MxCase{kTrain, {1, 2, 1, 300, 150, 128}, MaskKind::causal, true, false},  // Sq > Sk: fully masked rows
        MxCase{kTrain, {1, 3, 1, 77, 515, 128}, MaskKind::causal, true, true},    // MQA
        MxCase{kTrain, {2, 2, 2, 513, 1000, 64}, MaskKind::none, true, false, true},
        MxCase{kTrain, {1, 4, 2, 256, 512, 128}, MaskKind::none, true, true, true},
        MxCase{kTrain, {1, 2, 2, 256, 512, 64}, MaskKind::causal, false, true, true},
        MxCase{kTrain, {1, 2, 2, 129, 257, 128}, MaskKind::causal_top_left, true, true},
        MxCase{kMx, {1, 2, 2, 128, 128, 128}, MaskKind::none, true, true},
        MxCase{kMx, {1, 2, 2, 128, 128, 128}, MaskKind::none, true, false},
        MxCase{kMx, {2, 4, 2, 200, 333, 64}, MaskKind::causal, true, true},
        MxCase{kMx, {1, 2, 1, 300, 150, 128}, MaskKind::causal, true, false},
        MxCase{kMx, {1, 3, 1, 77, 515, 128}, MaskKind::causal, true, true},
        MxCase{kMx, {2, 2, 2, 513, 1000, 64}, MaskKind::none, true, false, true},
        MxCase{kMx, {1, 4, 2, 256, 512, 128}, MaskKind::none, true, true, true},
        MxCase{kMx, {1, 4, 4, 1024, 1024, 128}, MaskKind::causal, true, true, true},
        MxCase{kMx, {1, 2, 2, 1, 1, 64}, MaskKind::none, true, true},
        MxCase{kMx, {1, 2, 2, 129, 257, 128}, MaskKind::causal_top_left, true, true},
        MxCase{kMx, {1, 2, 2, 128, 128, 128}, MaskKind::none, false, true},              // exp2 FP4 P
        MxCase{kMx, {2, 4, 2, 200, 333, 64}, MaskKind::causal, false, true},
        MxCase{kMx, {2, 2, 2, 513, 1000, 64}, MaskKind::none, false, false, true},
        MxCase{kMx, {1, 4, 2, 256, 512, 128}, MaskKind::causal, false, true, true},
        // Three consumer warpgroups (192-row CTAs, D = 64) on the folded operands.
        MxCase{kTrain, {2, 2, 2, 513, 1000, 64}, MaskKind::none, true, false, true, 3},
        MxCase{kTrain, {2, 4, 2, 200, 333, 64}, MaskKind::causal, false, true, false, 3},
        MxCase{kMx, {2, 2, 2, 513, 1000, 64}, MaskKind::none, true, true, true, 3},
        MxCase{kMx, {1, 4, 4, 1024, 1024, 64}, MaskKind::none, false, true, false, 3},
        // One consumer warpgroup (64-row CTAs, two an SM) with exp2 FP4 P at D = 128,
        // the launcher's choice there: GQA with block outliers, odd lengths, and
        // Sq > Sk's fully masked rows; two consumers, which the launcher no
        // longer takes for it, forced.
        MxCase{kMx, {1, 4, 2, 256, 512, 128}, MaskKind::none, false, true, true, 1},
        MxCase{kMx, {2, 2, 2, 513, 1000, 128}, MaskKind::none, false, false, false, 1},
        MxCase{kMx, {1, 2, 1, 300, 150, 128}, MaskKind::causal, false, true, false, 1},
        MxCase{kMx, {1, 4, 2, 256, 512, 128}, MaskKind::causal, false, true, true, 2},
        // Sliding windows on recipe mxfp4 (both expansions): two-sided and
        // narrower than a tile, and rows that see no key; exp2 FP4 P on its
        // one-consumer kernel (the launcher's choice at D = 128), Direct-P on two.
        MxCase{kMx, {2, 4, 2, 700, 900, 128}, MaskKind::none, false, true, false, 0, {100, 37}},
        MxCase{kMx, {1, 2, 1, 600, 300, 128}, MaskKind::causal, false, true, true, 0, {130, 0}},
        MxCase{kMx, {2, 4, 2, 700, 900, 128}, MaskKind::causal, true, true, false, 0, {5, -1}},
        // D = 256: the fold pass feeds the 256-wide kernel (two CTAs per query block).
        MxCase{kMx, {2, 4, 2, 200, 333, 256}, MaskKind::causal, true, true},
        MxCase{kMx, {1, 2, 1, 300, 150, 256}, MaskKind::causal, true, false},
        MxCase{kMx, {1, 2, 2, 256, 512, 256}, MaskKind::none, false, true, true},  // exp2 FP4 P
        MxCase{kTrain, {2, 4, 2, 200, 333, 256}, MaskKind::causal, true, true},
        MxCase{kTrain, {1, 2, 2, 129, 257, 256}, MaskKind::causal_top_left, false, false}),
    case_name);

}  // namespace
}  // namespace fp4attn
