// Quantizers (DESIGN §3.2): each one against the plain re-implementation of its
// rule in quantize_reference.hpp, against ml_dtypes vectors, and against facts
// every correct quantizer satisfies.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "fp4attn/error.hpp"
#include "fp4attn/quantize.hpp"
#include "fp4attn/tensor.hpp"
#include "oracle_vectors.hpp"
#include "quantize_reference.hpp"

namespace fp4attn {
namespace {

using namespace test_support;

void expect_same(const QuantizedTensor& got, const QuantizedTensor& want, const std::string& what) {
  SCOPED_TRACE(what);
  ASSERT_EQ(got.codes.size(), want.codes.size());
  std::size_t bad = 0;
  for (std::size_t i = 0; i < want.codes.size(); ++i)
    if (got.codes[i] != want.codes[i] && ++bad <= 5)
      ADD_FAILURE() << "code " << i << ": " << int(got.codes[i]) << " vs " << int(want.codes[i]);
  EXPECT_EQ(bad, 0u);
  EXPECT_EQ(got.scales, want.scales);
  EXPECT_EQ(got.scale_codes, want.scale_codes);
  EXPECT_EQ(got.tensor_scale, want.tensor_scale);
}

struct Case {
  TensorFormat format;
  BlockAxis axis;
  MxScaleRule rule;
};
const Case kCases[] = {
    {TensorFormat::fp8_e4m3, BlockAxis::along_d, MxScaleRule::round_up},
    {TensorFormat::fp8_e4m3, BlockAxis::along_s, MxScaleRule::round_up},
    {TensorFormat::mxfp4, BlockAxis::along_d, MxScaleRule::round_up},
    {TensorFormat::mxfp4, BlockAxis::along_s, MxScaleRule::round_up},
    {TensorFormat::mxfp4, BlockAxis::along_d, MxScaleRule::ocp_floor},
    {TensorFormat::mxfp4, BlockAxis::along_s, MxScaleRule::ocp_floor},
    {TensorFormat::nvfp4, BlockAxis::along_d, MxScaleRule::round_up},
    {TensorFormat::nvfp4, BlockAxis::along_s, MxScaleRule::round_up},
};
std::string name_of(const Case& c) {
  return std::string(to_string(c.format)) + (c.axis == BlockAxis::along_d ? " along_d" : " along_s") +
         (c.rule == MxScaleRule::ocp_floor ? " ocp_floor" : "");
}

// ---- scale rules ------------------------------------------------------------------

TEST(Quantize, MxScaleKnownAnswers) {
  EXPECT_EQ(mx_scale_code(6.0f, MxScaleRule::round_up), 127);  // 6 / 2^0 = 6: fits exactly
  EXPECT_EQ(mx_scale_code(std::nextafter(6.0f, 7.0f), MxScaleRule::round_up), 128);
  EXPECT_EQ(mx_scale_code(4.0f, MxScaleRule::round_up), 127);
  EXPECT_EQ(mx_scale_code(3.0f, MxScaleRule::round_up), 126);
  EXPECT_EQ(mx_scale_code(7.0f, MxScaleRule::ocp_floor), 127);  // clips 7 to 6
  EXPECT_EQ(mx_scale_code(8.0f, MxScaleRule::ocp_floor), 128);
  EXPECT_EQ(mx_scale_code(0.0f, MxScaleRule::round_up), 0);
  EXPECT_EQ(mx_scale_code(std::numeric_limits<float>::max(), MxScaleRule::round_up), 253);
  EXPECT_EQ(mx_scale_code(std::numeric_limits<float>::denorm_min(), MxScaleRule::round_up), 0);  // clamped
  EXPECT_THROW(mx_scale_code(std::numeric_limits<float>::infinity(), MxScaleRule::round_up), Error);
}

// Exact search in double vs the integer bit rule, over every binade (float
// subnormals included) and the values around each 1.5·2^e switch point.
TEST(Quantize, MxScaleMatchesExactSearchAndNeverClips) {
  std::mt19937 rng(3);
  std::vector<float> amaxes;
  for (int e = -149; e <= 127; ++e) {
    const float switch_point = static_cast<float>(std::ldexp(1.5, e));
    if (switch_point == 0.0f || !std::isfinite(switch_point)) continue;
    for (float a : {std::ldexp(1.0f, e), switch_point, std::nextafter(switch_point, 0.0f),
                    std::nextafter(switch_point, std::numeric_limits<float>::infinity())})
      if (a > 0.0f && std::isfinite(a)) amaxes.push_back(a);
  }
  for (int i = 0; i < 200000; ++i)
    amaxes.push_back(std::bit_cast<float>(static_cast<std::uint32_t>(rng() % 0x7F800000u)));
  for (float a : amaxes) {
    if (a == 0.0f) continue;
    for (MxScaleRule rule : {MxScaleRule::round_up, MxScaleRule::ocp_floor}) {
      const std::uint8_t code = mx_scale_code(a, rule);
      ASSERT_EQ(code, reference_mx_code(a, rule)) << "amax " << a;
      const double ratio = a / std::ldexp(1.0, code - kE8M0Bias);
      if (rule == MxScaleRule::round_up) {
        ASSERT_LE(ratio, kMxElementMax) << a;  // never clips
        if (code > 0) {
          ASSERT_GT(ratio, kMxElementMax / 2) << a;  // and is the tightest such scale
        }
      } else if (code > 0) {
        ASSERT_GE(ratio, 4.0) << a;  // OCP: amax / X in [4, 8), so it clips above 6
        ASSERT_LT(ratio, 8.0) << a;
      }
    }
  }
}

TEST(Quantize, Fp8AndNvfp4ScaleFormulas) {
  EXPECT_EQ(fp8_block_scale(448.0f), 1.0f);
  EXPECT_EQ(fp8_block_scale(3.0f), 3.0f / 448.0f);
  EXPECT_EQ(fp8_block_scale(0.0f), 1.0f);
  EXPECT_EQ(nvfp4_tensor_scale(2688.0f), 1.0f);
  EXPECT_EQ(nvfp4_tensor_scale(10.0f), 268.8f);
  EXPECT_EQ(nvfp4_tensor_scale(0.0f), 1.0f);
  // A tiny tensor amax must not overflow S_enc to Inf.
  EXPECT_TRUE(std::isfinite(nvfp4_tensor_scale(std::numeric_limits<float>::denorm_min())));
  // The block holding the tensor amax gets the largest UE4M3 scale, 448.
  const float s_enc = nvfp4_tensor_scale(10.0f);
  EXPECT_EQ(decode(ElemFormat::ue4m3, nvfp4_block_scale_code(10.0f, s_enc)), 448.0f);
  EXPECT_EQ(nvfp4_block_scale_code(1.0f, s_enc), nearest_code(ElemFormat::ue4m3, 268.8 / 6));
}

// ---- quantizers vs the re-implementation ---------------------------------------

TEST(Quantize, MatchesTheRuleReimplementation) {
  // S = 40 leaves a partial last block for every token block (16, 32) used here.
  for (const Shape sh : {Shape{2, 40, 3, 64}, Shape{1, 17, 2, 32}}) {
    const std::vector<float> x = varied_tensor(sh, static_cast<std::uint32_t>(sh.S));
    for (const Case& c : kCases) {
      QuantizeOptions opt;
      opt.fp8_token_block = 16;
      opt.mx_scale_rule = c.rule;
      const QuantizedTensor got = quantize(x, sh.B, sh.S, sh.H, sh.D, c.format, c.axis, opt, "x");
      expect_same(got, reference_quantize(x, sh, c.format, c.axis, opt), name_of(c) + " S=" + std::to_string(sh.S));
    }
  }
}

TEST(Quantize, MatchesMlDtypesVectors) {
  const test_support::OracleVectors v(std::string(FP4ATTN_TEST_DATA_DIR) + "/quantize.vec");
  const std::vector<std::uint32_t> dims = v.u32s("input.shape");
  ASSERT_EQ(dims.size(), 4u);
  const Shape sh{dims[0], dims[1], dims[2], dims[3]};
  const std::vector<float> x = v.floats("input");
  ASSERT_EQ(static_cast<std::int64_t>(x.size()), sh.numel());
  for (const Case& c : kCases) {
    QuantizeOptions opt;
    opt.fp8_token_block = static_cast<int>(v.u32s("fp8_token_block").at(0));
    opt.mx_scale_rule = c.rule;
    const std::string axis = c.axis == BlockAxis::along_d ? "along_d" : "along_s";
    std::string key = std::string(to_string(c.format)) + "." + axis;
    if (c.format == TensorFormat::mxfp4) key += c.rule == MxScaleRule::round_up ? ".round_up" : ".ocp_floor";
    if (c.format == TensorFormat::fp8_e4m3) key = "fp8." + axis;
    SCOPED_TRACE(key);
    const QuantizedTensor got = quantize(x, sh.B, sh.S, sh.H, sh.D, c.format, c.axis, opt, "x");
    EXPECT_EQ(got.codes, v.bytes(key + ".codes"));
    if (c.format == TensorFormat::fp8_e4m3) {
      EXPECT_EQ(got.scales, v.floats(key + ".scales"));
    } else {
      EXPECT_EQ(got.scale_codes, v.bytes(key + ".scale_codes"));
    }
    if (c.format == TensorFormat::nvfp4) {
      EXPECT_EQ(got.tensor_scale, v.floats(key + ".tensor_scale").at(0));
    }
  }
}

// The recipe pins fp32 operations and their order (DESIGN §3.2). Inputs that
// sit on a rounding tie after one order but not after a reassociated one are
// searched for here, so a quantizer that multiplies by a reciprocal or
// regroups a product fails this test.
template <class Rule, class Other>
std::vector<float> near_ties(ElemFormat f, double unit, Rule rule, Other other, std::size_t limit) {
  constexpr int kUlpsAround = 3;
  std::vector<float> found;
  for (std::uint32_t c = 0; c < spec_of(f).max_code && found.size() < limit; ++c) {
    float x = static_cast<float>((decode(f, c) + decode(f, c + 1)) / 2 * unit);
    for (int k = 0; k < kUlpsAround; ++k) x = std::nextafter(x, 0.0f);
    for (int k = 0; k <= 2 * kUlpsAround && found.size() < limit; ++k, x = std::nextafter(x, 1e30f))
      if (nearest_code(f, rule(x)) != nearest_code(f, other(x))) found.push_back(x);
  }
  return found;
}

TEST(Quantize, Fp32OperationOrderIsPinned) {
  constexpr std::int64_t kWidth = 64;
  QuantizeOptions opt;
  opt.fp8_token_block = 1;
  // FP8: x / scale, not x · (1 / scale). One token per scale block, its first element the block maximum.
  std::vector<float> fp8_rows;
  std::size_t fp8_found = 0;
  for (float amax : {300.7f, 0.0123f, 77.77f, 1.1f, 5000.3f, 0.3f, 9.9f, 123.456f}) {
    const float scale = amax / kE4M3Max;
    std::vector<float> row = near_ties(
        ElemFormat::e4m3, scale, [&](float x) { return x / scale; }, [&](float x) { return x * (1.0f / scale); },
        kWidth - 1);
    fp8_found += row.size();
    row.insert(row.begin(), amax);
    row.resize(kWidth, 0.0f);
    fp8_rows.insert(fp8_rows.end(), row.begin(), row.end());
  }
  ASSERT_GT(fp8_found, 8u);
  const Shape fp8_shape{1, static_cast<std::int64_t>(fp8_rows.size()) / kWidth, 1, kWidth};
  expect_same(quantize(fp8_rows, 1, fp8_shape.S, 1, kWidth, TensorFormat::fp8_e4m3, BlockAxis::along_d, opt, "x"),
              reference_quantize(fp8_rows, fp8_shape, TensorFormat::fp8_e4m3, BlockAxis::along_d, opt), "fp8");

  // NVFP4: s_b from (amax · S_enc) / 6 and q from (x · S_enc) / s_b, not regrouped.
  const float tensor_amax = 1000.3f;
  const float s_enc = kNvfp4Numerator / tensor_amax;
  const std::vector<float> block_maxima = near_ties(
      ElemFormat::ue4m3, kE2M1Max / s_enc, [&](float a) { return (a * s_enc) / kE2M1Max; },
      [&](float a) { return a * (s_enc / kE2M1Max); }, 64);
  ASSERT_GT(block_maxima.size(), 4u);
  std::vector<float> nv_rows(kNvfp4Block, 0.0f);
  nv_rows[0] = tensor_amax;
  std::size_t nv_found = 0;
  for (float a : block_maxima) {
    const float sb = decode(ElemFormat::ue4m3, encode_rne_sat(ElemFormat::ue4m3, (a * s_enc) / kE2M1Max));
    std::vector<float> row = near_ties(
        ElemFormat::e2m1, sb / s_enc, [&](float x) { return (x * s_enc) / sb; },
        [&](float x) { return x * (s_enc / sb); }, kNvfp4Block - 1);
    std::erase_if(row, [&](float x) { return x > a; });  // a stays the block maximum
    nv_found += row.size();
    row.insert(row.begin(), a);
    row.resize(kNvfp4Block, 0.0f);
    nv_rows.insert(nv_rows.end(), row.begin(), row.end());
  }
  ASSERT_GT(nv_found, 4u);
  const Shape nv_shape{1, static_cast<std::int64_t>(nv_rows.size()) / kNvfp4Block, 1, kNvfp4Block};
  expect_same(quantize(nv_rows, 1, nv_shape.S, 1, kNvfp4Block, TensorFormat::nvfp4, BlockAxis::along_d, opt, "x"),
              reference_quantize(nv_rows, nv_shape, TensorFormat::nvfp4, BlockAxis::along_d, opt), "nvfp4");
}

// ---- facts ------------------------------------------------------------------------

// Distance between the two codes that bracket |y| (the top step above the maximum).
double code_step(ElemFormat f, double y) {
  const int top = spec_of(f).max_code;
  const double a = std::fabs(y);
  int c = encode_rne_sat(f, static_cast<float>(a)) & top;
  if (decode(f, c) > a || c == top) --c;
  return decode(f, c + 1) - decode(f, c);
}

// NVFP4 holds only while the block scale is a normal UE4M3 value: a block
// far below the tensor maximum gets a subnormal scale (too coarse to keep the
// block maximum within 6) or a zero one (the whole block flushes to zero).
TEST(Quantize, DequantizedErrorIsAtMostHalfACodeStep) {
  const Shape sh{2, 40, 2, 64};
  const std::vector<float> x = varied_tensor(sh, 99);
  const float smallest_normal_ue4m3 = decode(ElemFormat::ue4m3, 1u << 3);
  for (const Case& c : kCases) {
    if (c.rule == MxScaleRule::ocp_floor) continue;  // may clip: checked separately
    QuantizeOptions opt;
    opt.fp8_token_block = 16;
    const QuantizedTensor t = quantize(x, sh.B, sh.S, sh.H, sh.D, c.format, c.axis, opt, "x");
    const std::vector<float> v = t.dequantize();
    const ElemFormat ef = element_format(c.format);
    SCOPED_TRACE(name_of(c));
    std::int64_t checked = 0;
    for (std::int64_t b = 0; b < sh.B; ++b)
      for (std::int64_t s = 0; s < sh.S; ++s)
        for (std::int64_t h = 0; h < sh.H; ++h)
          for (std::int64_t d = 0; d < sh.D; ++d) {
            const std::int64_t i = bshd_index(sh.S, sh.H, sh.D, b, s, h, d);
            ASSERT_EQ(v[i], t.value(b, s, h, d));
            const float scale = t.scales[t.scale_index(b, s, h, d)];
            if (c.format == TensorFormat::nvfp4 && scale < smallest_normal_ue4m3) {
              if (scale == 0.0f) {
                ASSERT_EQ(v[i], 0.0f);
                // The block scale rounded to zero: block_amax·S_enc/6 is at most half of UE4M3's smallest step.
                ASSERT_LE(std::fabs(x[i]) * t.tensor_scale / kE2M1Max, decode(ElemFormat::ue4m3, 1) / 2);
              }
              continue;
            }
            ++checked;
            const double unit = scale / t.tensor_scale;  // x ≈ code value · unit
            // Half a step in code units, plus the fp32 roundings of x / scale and code · scale.
            const double bound =
                code_step(ef, x[i] / unit) / 2 * unit + 4 * std::numeric_limits<float>::epsilon() * std::fabs(x[i]);
            ASSERT_LE(std::fabs(double{v[i]} - x[i]), bound) << "x = " << x[i] << " at " << i;
          }
    EXPECT_GT(checked, sh.numel() / 2);
  }
}

TEST(Quantize, BlockMaximaLandOnTheFormatMaximum) {
  const Shape sh{1, 40, 2, 64};
  const std::vector<float> x = varied_tensor(sh, 5);
  QuantizeOptions opt;
  opt.fp8_token_block = 16;
  for (BlockAxis axis : {BlockAxis::along_d, BlockAxis::along_s}) {
    const QuantizedTensor fp8 = quantize(x, sh.B, sh.S, sh.H, sh.D, TensorFormat::fp8_e4m3, axis, opt, "x");
    for (const Block& blk : blocks_of(sh, TensorFormat::fp8_e4m3, axis, opt.fp8_token_block))
      for (std::int64_t i : blk.elems)
        if (std::fabs(x[i]) == block_amax(x, blk) && x[i] != 0.0f) {
          EXPECT_EQ(fp8.codes[i] & 0x7F, spec_of(ElemFormat::e4m3).max_code) << "FP8 block max at " << i;
        }
  }
  const QuantizedTensor nv = quantize(x, sh.B, sh.S, sh.H, sh.D, TensorFormat::nvfp4, BlockAxis::along_d, opt, "x");
  const auto amax_at =
      std::max_element(x.begin(), x.end(), [](float a, float b) { return std::fabs(a) < std::fabs(b); });
  EXPECT_EQ(nv.tensor_scale, kNvfp4Numerator / std::fabs(*amax_at));
  const std::int64_t i = amax_at - x.begin();
  EXPECT_EQ(nv.codes[i] & 0x7, spec_of(ElemFormat::e2m1).max_code);  // 6
  const std::int64_t d = i % sh.D, h = (i / sh.D) % sh.H, s = i / (sh.D * sh.H);
  EXPECT_EQ(nv.scales[nv.scale_index(0, s, h, d)], kE4M3Max);
}

// A block with maximum 7: round-up scale 2 keeps it (7/2 = 3.5 → 4·2 = 8 is
// the nearest code value, within half a step); the OCP floor scale 1 clips it to 6.
TEST(Quantize, OcpFloorClipsWhereRoundUpDoesNot) {
  std::vector<float> x(kMxfp4Block, 0.25f);
  x[3] = 7.0f;
  QuantizeOptions opt;
  const QuantizedTensor up = quantize(x, 1, 1, 1, kMxfp4Block, TensorFormat::mxfp4, BlockAxis::along_d, opt, "x");
  opt.mx_scale_rule = MxScaleRule::ocp_floor;
  const QuantizedTensor ocp = quantize(x, 1, 1, 1, kMxfp4Block, TensorFormat::mxfp4, BlockAxis::along_d, opt, "x");
  EXPECT_EQ(up.scales[0], 2.0f);
  EXPECT_EQ(ocp.scales[0], 1.0f);
  EXPECT_EQ(up.dequantize()[3], 8.0f);
  EXPECT_EQ(ocp.dequantize()[3], 6.0f);
}

TEST(Quantize, PartialLastBlockAlongTheSequence) {
  // S = 40: MX blocks of 32 tokens leave tokens 32..39 alone in the last block.
  const Shape sh{1, 40, 1, 8};
  std::vector<float> x(static_cast<std::size_t>(sh.numel()), 0.01f);
  x[bshd_index(sh.S, sh.H, sh.D, 0, 5, 0, 2)] = 100.0f;  // first block, channel 2
  x[bshd_index(sh.S, sh.H, sh.D, 0, 35, 0, 2)] = 0.75f;  // last block, channel 2
  for (TensorFormat f : {TensorFormat::mxfp4, TensorFormat::nvfp4}) {
    const QuantizedTensor t = quantize(x, sh.B, sh.S, sh.H, sh.D, f, BlockAxis::along_s, {}, "v");
    const int block = f == TensorFormat::mxfp4 ? kMxfp4Block : kNvfp4Block;
    ASSERT_EQ(t.scales.size(), static_cast<std::size_t>((sh.S + block - 1) / block * sh.D));
    const float last = t.scales[t.scale_index(0, 39, 0, 2)];
    // The last block's scale follows its own maximum 0.75, not the 100 of block 0.
    EXPECT_NEAR(t.value(0, 35, 0, 2), 0.75f, 0.75f * 0.07f) << to_string(f);
    EXPECT_LT(last, t.scales[t.scale_index(0, 5, 0, 2)]) << to_string(f);
    EXPECT_EQ(t.scale_index(0, 39, 0, 2), t.scale_index(0, 32, 0, 2));
  }
}

TEST(Quantize, ScaleLayout) {
  const Shape sh{2, 40, 3, 64};
  const std::vector<float> x = varied_tensor(sh, 8);
  QuantizeOptions opt;
  opt.fp8_token_block = 16;
  const auto q = [&](TensorFormat f, BlockAxis a) { return quantize(x, sh.B, sh.S, sh.H, sh.D, f, a, opt, "x"); };
  const QuantizedTensor fd = q(TensorFormat::fp8_e4m3, BlockAxis::along_d),
                        fs = q(TensorFormat::fp8_e4m3, BlockAxis::along_s);
  const QuantizedTensor md = q(TensorFormat::mxfp4, BlockAxis::along_d),
                        ns = q(TensorFormat::nvfp4, BlockAxis::along_s);
  EXPECT_EQ(fd.scales.size(), 2u * 3 * 3);
  EXPECT_EQ(fd.scale_index(1, 33, 2, 5), (1 * 3 + 2) * 3 + 2);
  EXPECT_EQ(fs.scales.size(), 2u * 3 * 64);
  EXPECT_EQ(fs.scale_index(1, 33, 2, 5), (1 * 3 + 2) * 64 + 5);
  EXPECT_EQ(md.scales.size(), 2u * 40 * 3 * 2);
  EXPECT_EQ(md.scale_index(1, 33, 2, 40), ((1 * 40 + 33) * 3 + 2) * 2 + 1);
  EXPECT_EQ(ns.scales.size(), 2u * 3 * 3 * 64);
  EXPECT_EQ(ns.scale_index(1, 33, 2, 5), ((1 * 3 + 2) * 3 + 2) * 64 + 5);
}

// ---- smooth_k ---------------------------------------------------------------------

TEST(Quantize, SequenceMeanKnownAnswer) {
  // k[s] = c + (s - (S-1)/2)·δ: deviations cancel exactly, the mean is c.
  const Shape sh{2, 9, 2, 4};
  std::vector<float> k(static_cast<std::size_t>(sh.numel()));
  for (std::int64_t b = 0; b < sh.B; ++b)
    for (std::int64_t s = 0; s < sh.S; ++s)
      for (std::int64_t h = 0; h < sh.H; ++h)
        for (std::int64_t d = 0; d < sh.D; ++d)
          k[bshd_index(sh.S, sh.H, sh.D, b, s, h, d)] = static_cast<float>(10 * b + 3 * h + d) + 0.25f * (s - 4);
  const std::vector<float> mean = sequence_mean(k, sh.B, sh.S, sh.H, sh.D);
  ASSERT_EQ(mean.size(), static_cast<std::size_t>(sh.B * sh.H * sh.D));
  for (std::int64_t b = 0; b < sh.B; ++b)
    for (std::int64_t h = 0; h < sh.H; ++h)
      for (std::int64_t d = 0; d < sh.D; ++d) EXPECT_EQ(mean[(b * sh.H + h) * sh.D + d], 10 * b + 3 * h + d);
}

TEST(Quantize, SmoothedKeysHaveZeroMean) {
  const Shape sh{2, 33, 3, 16};
  std::vector<float> k = varied_tensor(sh, 21, 3);
  for (float& v : k) v += 40.0f;  // the large common offset smooth_k exists to remove
  const std::vector<float> mean = sequence_mean(k, sh.B, sh.S, sh.H, sh.D);
  const std::vector<float> smooth = subtract_sequence_mean(k, mean, sh.B, sh.S, sh.H, sh.D);
  for (std::int64_t b = 0; b < sh.B; ++b)
    for (std::int64_t h = 0; h < sh.H; ++h)
      for (std::int64_t d = 0; d < sh.D; ++d) {
        double sum = 0, sum_abs = 0;
        for (std::int64_t s = 0; s < sh.S; ++s) {
          const std::int64_t i = bshd_index(sh.S, sh.H, sh.D, b, s, h, d);
          ASSERT_EQ(smooth[i], k[i] - mean[(b * sh.H + h) * sh.D + d]);  // fp32 subtraction
          sum += k[i];
          sum_abs += std::fabs(smooth[i]);
        }
        EXPECT_EQ(mean[(b * sh.H + h) * sh.D + d], static_cast<float>(sum / sh.S));
        double smooth_sum = 0;
        for (std::int64_t s = 0; s < sh.S; ++s) smooth_sum += smooth[bshd_index(sh.S, sh.H, sh.D, b, s, h, d)];
        EXPECT_LE(std::fabs(smooth_sum), 1e-5 * (sum_abs + 40.0 * sh.S));
      }
  EXPECT_THROW(subtract_sequence_mean(k, std::vector<float>(3), sh.B, sh.S, sh.H, sh.D), Error);
}

// ---- bad input --------------------------------------------------------------------

TEST(Quantize, NonFiniteInputNamesTheArgumentAndIndex) {
  const Shape sh{2, 5, 3, 32};
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                    -std::numeric_limits<float>::infinity()})
    for (const Case& c : kCases) {
      std::vector<float> x = varied_tensor(sh, 1);
      x[bshd_index(sh.S, sh.H, sh.D, 1, 2, 0, 3)] = bad;
      try {
        quantize(x, sh.B, sh.S, sh.H, sh.D, c.format, c.axis, {}, "k");
        ADD_FAILURE() << name_of(c) << ": no error for " << bad;
      } catch (const Error& e) {
        EXPECT_EQ(e.argument(), "k");
        EXPECT_NE(std::string(e.what()).find("[1, 2, 0, 3]"), std::string::npos) << e.what();
      }
    }
  std::vector<float> x(4, 1.0f);
  x[2] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_THROW(require_finite(x, "q"), Error);
  EXPECT_NO_THROW(require_finite(std::vector<float>(4, 1.0f), "q"));
}

TEST(Quantize, BadSizesNameTheArgument) {
  const std::vector<float> x(2 * 4 * 48, 1.0f);
  const auto expect_error = [](auto&& call, const std::string& argument) {
    try {
      call();
      ADD_FAILURE() << "no error for " << argument;
    } catch (const Error& e) {
      EXPECT_EQ(e.argument(), argument) << e.what();
    }
  };
  expect_error([&] { quantize(x, 1, 4, 2, 47, TensorFormat::fp8_e4m3, BlockAxis::along_d, {}, "v"); }, "v");
  expect_error([&] { quantize(x, 1, 4, 2, 48, TensorFormat::mxfp4, BlockAxis::along_d, {}, "q"); }, "q");  // 48 % 32
  const std::vector<float> x40(4 * 40, 1.0f);
  expect_error([&] { quantize(x40, 1, 4, 1, 40, TensorFormat::nvfp4, BlockAxis::along_d, {}, "k"); }, "k");  // 40 % 16
  expect_error([&] { quantize(x, 0, 4, 2, 48, TensorFormat::fp8_e4m3, BlockAxis::along_d, {}, "k"); }, "k");
  QuantizeOptions opt;
  opt.fp8_token_block = 0;
  expect_error([&] { quantize(x, 1, 4, 2, 48, TensorFormat::fp8_e4m3, BlockAxis::along_d, opt, "k"); },
               "fp8_token_block");
  // Along the sequence D needs no particular multiple.
  EXPECT_NO_THROW(quantize(x, 1, 4, 2, 48, TensorFormat::mxfp4, BlockAxis::along_s, {}, "v"));
}

}  // namespace
}  // namespace fp4attn
