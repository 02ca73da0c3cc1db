// Direct-P contract (DESIGN §3.3): the code of p = 2^u chosen without exp and
// without a float→fp8/fp4 conversion is (a) monotone in u, (b) never more than
// one code step from the round-to-nearest code of the exact p (computed here in
// double), and (c) equal to it except where p lies within 1 % (relative) of a
// rounding boundary. Checked over 10^7 random scores and dense sweeps across
// every rounding threshold; the agreement rate is printed and recorded.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iomanip>
#include <iostream>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "emulator/ex2_sm90.hpp"
#include "emulator/operands.hpp"
#include "emulator/p_row.hpp"
#include "fp4attn/direct_p.hpp"
#include "fp4attn/formats.hpp"

namespace fp4attn {
namespace {

using direct_p::kFp8Offset;
using direct_p::kNvfp4Offset;

constexpr double kBoundaryBand = 0.01;  // the contract's 1 % band around rounding boundaries
constexpr float kLowestScore = -30.0f;
constexpr std::size_t kRandomScores = 10'000'000;
constexpr std::size_t kRandomBlocks = 300'000;
constexpr int kSweepSteps = 2000;           // grid points across ±2 % of each boundary
constexpr double kSweepHalfWidth = 0.0286;  // log2(1.02)
constexpr int kSweepUlps = 300;             // consecutive floats on each side of each boundary
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Round-to-nearest-even code of a non-negative double, saturating: scaling by a
// power of two is exact and nearbyint rounds ties to even.
int exact_code(ElemFormat f, double p) {
  const MiniFloatSpec s = spec_of(f);
  if (p >= decode(f, s.max_code)) return s.max_code;
  if (p == 0.0) return 0;
  const int quantum = std::max(std::ilogb(p), 1 - s.bias) - s.man_bits;
  const double n = std::nearbyint(std::ldexp(p, -quantum));
  return encode_rne_sat(f, static_cast<float>(std::ldexp(n, quantum)));  // an exact format value
}

// Rounding boundaries of a format: midpoints between adjacent positive values.
std::vector<double> boundaries_of(ElemFormat f) {
  std::vector<double> b;
  for (std::uint32_t c = 0; c < spec_of(f).max_code; ++c) b.push_back((decode(f, c) + decode(f, c + 1)) / 2.0);
  return b;
}

bool near_boundary(const std::vector<double>& bounds, double p) {
  const auto it = std::lower_bound(bounds.begin(), bounds.end(), p);
  if (it != bounds.end() && std::fabs(p - *it) <= kBoundaryBand * *it) return true;
  return it != bounds.begin() && std::fabs(p - *(it - 1)) <= kBoundaryBand * *(it - 1);
}

// Tallies (b) and (c) for one format; reports the first few violations.
class Contract {
 public:
  Contract(std::string name, ElemFormat f) : name_(std::move(name)), bounds_(boundaries_of(f)), format_(f) {}

  void check(int code, double exact_p, float u) {
    const int want = exact_code(format_, exact_p);
    ++total_;
    if (code == want) {
      ++equal_;
      return;
    }
    const bool excused = near_boundary(bounds_, exact_p);
    if ((std::abs(code - want) > 1 || !excused) && ++violations_ <= 10)
      ADD_FAILURE() << name_ << ": u = " << std::setprecision(9) << u << ", p = " << exact_p << ": code " << code
                    << ", exact RNE " << want << (excused ? " (more than one step)" : " (outside the 1 % band)");
  }

  // Prints and records the agreement rate; fails on any violation.
  void report(const std::string& property) const {
    const double rate = static_cast<double>(equal_) / static_cast<double>(total_);
    std::ostringstream line;
    line << std::setprecision(6) << rate << " (" << equal_ << " of " << total_ << ")";
    std::cout << name_ << " agreement with exact round-to-nearest: " << line.str() << "\n";
    ::testing::Test::RecordProperty(property, line.str());
    EXPECT_EQ(violations_, 0u) << name_;
    EXPECT_GT(total_, 0u);
  }

 private:
  std::string name_;
  std::vector<double> bounds_;
  ElemFormat format_;
  std::uint64_t total_ = 0, equal_ = 0, violations_ = 0;
};

// Scores around mid, ascending: a uniform grid over ±half_width plus the
// consecutive floats nearest to mid.
std::vector<float> sweep_around(double mid, double half_width) {
  std::vector<float> u;
  for (int i = 0; i <= kSweepSteps; ++i)
    u.push_back(static_cast<float>(mid - half_width + 2 * half_width * i / kSweepSteps));
  float x = static_cast<float>(mid);
  for (int i = 0; i < kSweepUlps; ++i) x = std::nextafter(x, kNegInf);
  for (int i = 0; i < 2 * kSweepUlps; ++i, x = std::nextafter(x, 1e30f)) u.push_back(x);
  std::sort(u.begin(), u.end());
  return u;
}

// ---- building blocks ----------------------------------------------------------------

TEST(DirectP, Exp2PolyRelativeError) {
  constexpr double kMaxRelError = 2e-3;
  constexpr double kLow = -12.0, kHigh = 127.0;
  constexpr int kSteps = 2'000'000;
  double worst = 0;
  for (int i = 0; i <= kSteps; ++i) {
    const double t = kLow + (kHigh - kLow) * i / kSteps;
    const float tf = static_cast<float>(t);
    worst = std::max(worst, std::fabs(direct_p::exp2_poly(tf) / std::exp2(double{tf}) - 1.0));
  }
  // The fit's edges: remainders of exactly ±0.5 around every integer.
  for (int j = -12; j < 127; ++j)
    for (float f : {-0.5f, 0.5f, std::nextafter(0.5f, 0.0f), std::nextafter(-0.5f, 0.0f)}) {
      const float tf = static_cast<float>(j) + f;
      if (tf < kLow) continue;
      worst = std::max(worst, std::fabs(direct_p::exp2_poly(tf) / std::exp2(double{tf}) - 1.0));
    }
  std::cout << "exp2_poly max relative error: " << worst << "\n";
  RecordProperty("exp2_poly_max_rel_error", std::to_string(worst));
  EXPECT_LT(worst, kMaxRelError);
  EXPECT_GT(worst, 0.0);  // it is an approximation: an exact result would mean the test measures nothing
}

// Step 1: x = round-to-nearest-even(2^10·u) + bias, saturated to u16, against
// the same formula in double arithmetic.
TEST(DirectP, Fp8FixedPointRoundsAndSaturates) {
  constexpr double kUnitsPerLog2 = 1 << direct_p::kFp8FixedFractionBits;
  const auto oracle = [&](float u) {
    const double n = std::nearbyint(kUnitsPerLog2 * u + direct_p::kFp8FixedBias);
    return static_cast<std::uint32_t>(std::clamp(n, 0.0, double{direct_p::kFp8FixedMax}));
  };
  std::mt19937_64 rng(5);
  std::uniform_real_distribution<float> score(-40.0f, 1.0f);
  for (int i = 0; i < 1'000'000; ++i) {
    const float u = score(rng);
    ASSERT_EQ(direct_p::fp8_fixed_point(u), oracle(u)) << u;
  }
  // Ties of the 2^-11 grid round to even, as the FFMA does on the denormal grid.
  for (int k = -4000; k < 1000; ++k) {
    const float tie = static_cast<float>((k + 0.5) / kUnitsPerLog2);
    ASSERT_EQ(direct_p::fp8_fixed_point(tie), oracle(tie)) << tie;
  }
  EXPECT_EQ(direct_p::fp8_fixed_point(0.0f), direct_p::kFp8FixedBias);
  for (float low : {kNegInf, -std::numeric_limits<float>::max(), -1e6f, -22.0f})
    EXPECT_EQ(direct_p::fp8_fixed_point(low), 0u) << low;
  EXPECT_EQ(direct_p::fp8_fixed_point(1e6f), direct_p::kFp8FixedMax);
}

// The fp16 model of the packed steps: values against ldexp, and rounding to
// nearest even at every midpoint between adjacent fp16 values.
TEST(DirectP, F16ModelRoundsToNearestEven) {
  // IEEE binary16 written out independently of the header's model.
  constexpr std::uint32_t kLargestFinite = 0x7BFF, kMantissaMask = 0x3FF, kSmallestNormalBits = 0x400;
  constexpr int kMantissaBits = 10, kBias = 15, kSubnormalExp = -24;
  for (std::uint32_t h = 0; h < kLargestFinite; ++h) {
    const double lo = h < kSmallestNormalBits
                          ? std::ldexp(double(h), kSubnormalExp)
                          : std::ldexp(1.0 + std::ldexp(double(h & kMantissaMask), -kMantissaBits),
                                       static_cast<int>(h >> kMantissaBits) - kBias);
    ASSERT_EQ(double{direct_p::f16_value(h)}, lo) << h;
    ASSERT_EQ(direct_p::f16_bits_rne(direct_p::f16_value(h)), h);
    const double hi = direct_p::f16_value(h + 1);
    const float mid = static_cast<float>((lo + hi) / 2);  // exact: fp16 midpoints have 12 significant bits
    ASSERT_EQ(direct_p::f16_bits_rne(mid), (h & 1u) ? h + 1 : h) << h;
    ASSERT_EQ(direct_p::f16_bits_rne(std::nextafter(mid, 0.0f)), h) << h;
    ASSERT_EQ(direct_p::f16_bits_rne(std::nextafter(mid, 1e30f)), h + 1) << h;
  }
}

// Step 2 over every x that the scores reach: the two-phase curve stays within
// its error budget of 2^(u + 8) (x exact here; its rounding of u adds 0.034 %).
TEST(DirectP, Fp8TwoPhaseCurveWithinBudget) {
  constexpr double kUnitsPerLog2 = 1 << direct_p::kFp8FixedFractionBits;
  constexpr double kCurve = 0.00755;                                   // ±, of the two shifted linear 2^y
  constexpr double kLn2 = 0.6931471805599453;
  constexpr double kBiasStep = kLn2 / (2 * kUnitsPerLog2);            // the bias is an integer
  constexpr double kF16Rounding = 0x1p-11;
  constexpr double kBudget = kCurve + kBiasStep + kF16Rounding;
  constexpr double kSmallestCodedP = 0x1p-10;  // half of E4M3's smallest subnormal: below it every code is 0
  double worst = 0;
  for (std::uint32_t x = 0; x <= direct_p::kFp8FixedBias; ++x) {
    const double p = std::exp2((x - double{direct_p::kFp8FixedBias}) / kUnitsPerLog2 + kFp8Offset);
    if (p < kSmallestCodedP) continue;
    worst = std::max(worst, std::fabs(direct_p::f16_value(direct_p::fp8_two_phase(x)) / p - 1.0));
  }
  std::cout << "two-phase v max relative error: " << worst << "\n";
  RecordProperty("fp8_two_phase_max_rel_error", std::to_string(worst));
  EXPECT_LT(worst, kBudget);
  EXPECT_GT(worst, 0.005);  // the curve's own error must show: else this measures nothing
}

// The row sum's helper is exact: compared with a double sum of the decoded values.
TEST(DirectP, Fp8DecodedSumIsExact) {
  std::mt19937 rng(11);
  std::uniform_int_distribution<std::uint32_t> code(0, spec_of(ElemFormat::e4m3).max_code);
  for (int i = 0; i < 1'000'000; ++i) {
    std::uint32_t word = 0;
    double exact = 0;
    for (int b = 0; b < 4; ++b) {
      const std::uint32_t c = code(rng);
      word |= c << (8 * b);
      exact += decode(ElemFormat::e4m3, c);
    }
    ASSERT_EQ(double{direct_p::fp8_decoded_sum_x4(word)}, exact) << std::hex << word;
  }
}

// Byte order of the packed form: the codes of u0 .. u3 in bytes 0 .. 3. (The
// GPU path, other instructions, is checked bit for bit against the scalar on
// the H200 by dev/direct_p_throughput.)
TEST(DirectP, Fp8PackedMatchesScalar) {
  std::mt19937_64 rng(13);
  std::uniform_real_distribution<float> score(kLowestScore, 0.0f);
  for (int i = 0; i < 100'000; ++i) {
    const float u[4] = {score(rng), score(rng), score(rng), score(rng)};
    const std::uint32_t word = direct_p::fp8_codes_x4(u[0], u[1], u[2], u[3]);
    for (int b = 0; b < 4; ++b) ASSERT_EQ((word >> (8 * b)) & 0xFFu, direct_p::fp8_code(u[b])) << u[b];
  }
}

TEST(DirectP, Log2OfUe4m3) {
  for (std::uint8_t c = 1; c < spec_of(ElemFormat::ue4m3).max_code + 1; ++c)
    EXPECT_NEAR(direct_p::log2_of_ue4m3(c), std::log2(double{decode(ElemFormat::ue4m3, c)}), 1e-6) << int(c);
}

TEST(DirectP, MaskedScoresGiveZero) {
  EXPECT_EQ(direct_p::fp8_code(kNegInf), 0);
  EXPECT_EQ(direct_p::fp8_code(-std::numeric_limits<float>::max()), 0);
  EXPECT_EQ(direct_p::fp8_code(-1e6f), 0);
  EXPECT_EQ(direct_p::mxfp4_code(kNegInf, 0), 0);
  EXPECT_EQ(direct_p::mx_block_exponent(kNegInf), direct_p::kNoBlockExponent);
  EXPECT_EQ(direct_p::nvfp4_block_scale(kNegInf), 0);
  EXPECT_EQ(direct_p::fp8_code(0.0f), encode_rne_sat(ElemFormat::e4m3, 256.0f));  // the row maximum maps to 256
}

// ---- FP8 P --------------------------------------------------------------------------

TEST(DirectP, Fp8ContractOnRandomScores) {
  std::mt19937_64 rng(20261129);
  std::uniform_real_distribution<float> score(kLowestScore, 0.0f);
  Contract contract("FP8 Direct-P (random u)", ElemFormat::e4m3);
  for (std::size_t i = 0; i < kRandomScores; ++i) {
    const float u = score(rng);
    contract.check(direct_p::fp8_code(u), std::exp2(double{u} + kFp8Offset), u);
  }
  contract.report("fp8_agreement_random");
}

TEST(DirectP, Fp8ContractAcrossEveryThreshold) {
  Contract contract("FP8 Direct-P (threshold sweeps)", ElemFormat::e4m3);
  int thresholds = 0;
  for (double b : boundaries_of(ElemFormat::e4m3)) {
    const double u_mid = std::log2(b) - kFp8Offset;
    if (u_mid > 0.0 || u_mid < kLowestScore) continue;  // P lives in (0, 256]
    ++thresholds;
    int last = -1;
    for (float u : sweep_around(u_mid, kSweepHalfWidth)) {
      if (u > 0.0f) continue;
      const int code = direct_p::fp8_code(u);
      ASSERT_GE(code, last) << "not monotone at u = " << u;
      last = code;
      contract.check(code, std::exp2(double{u} + kFp8Offset), u);
    }
  }
  // Every E4M3 boundary below 256, the largest P: one per code below that of 256.
  EXPECT_EQ(thresholds, encode_rne_sat(ElemFormat::e4m3, 256.0f));
  contract.report("fp8_agreement_thresholds");
}

TEST(DirectP, Fp8MonotoneOverTheWholeRange) {
  constexpr int kSteps = 10'000'000;
  int last = 0;
  for (int i = 0; i <= kSteps; ++i) {
    const float u = kLowestScore * static_cast<float>(kSteps - i) / kSteps;
    const int code = direct_p::fp8_code(u);
    ASSERT_GE(code, last) << "u = " << u;
    last = code;
  }
  EXPECT_EQ(last, encode_rne_sat(ElemFormat::e4m3, 256.0f));
}

// The sm90 target's FP8 P row (the kernels' rule): keys from
// kSm90Fp8MufuFirstKey of every 128 on take E4M3 of ex2.approx(s·c − (m − 8)),
// the others the curve. Both halves keep the contract; the MUFU half is round
// to nearest of the hardware's exp2, so it agrees with the exact code except
// within a few float steps of a boundary.
TEST(DirectP, Sm90Fp8RowSharesKeysWithMufuAndKeepsTheContract) {
  constexpr int kTile = 128, kRows = 20'000;
  const emulator::PConfig cfg{TensorFormat::fp8_e4m3, Target::sm90, true, MxScaleRule::round_up};
  ASSERT_TRUE(emulator::fp8_mufu_share(cfg));
  ASSERT_GT(direct_p::kSm90Fp8MufuFirstKey, 0);
  ASSERT_LT(direct_p::kSm90Fp8MufuFirstKey, kTile);
  std::mt19937_64 rng(20261130);
  std::uniform_real_distribution<float> score(-3000.0f, 3000.0f);  // raw s: products of E4M3 codes
  std::uniform_real_distribution<float> log_c(-12.0f, -8.0f);
  Contract curve("sm90 FP8 P row, curve keys", ElemFormat::e4m3);
  Contract mufu("sm90 FP8 P row, MUFU keys", ElemFormat::e4m3);
  std::vector<float> s(kTile), u(kTile), x(kTile), value(kTile), block(kTile / 32 + 1);
  std::size_t mufu_keys = 0, mufu_differs_from_curve = 0;
  for (int row = 0; row < kRows; ++row) {
    // Tiles of 64 keys (the emulator's block_k may be 64) start at 0 or 64 of the 128.
    const std::int64_t first_key = row % 3 == 0 ? 0 : row % 3 == 1 ? 64 : 128 * 7;
    const int n = first_key % kTile == 64 ? 64 : kTile;
    const float c = std::exp2(log_c(rng));
    float m = -INFINITY;
    for (int j = 0; j < n; ++j) m = std::max(m, (s[j] = score(rng)) * c);
    for (int j = 0; j < n; ++j) {
      u[j] = direct_p::log2_score(s[j], c, m);
      x[j] = direct_p::log2_score(s[j], c, m - kFp8Offset);
    }
    emulator::make_p_row(cfg, std::span<const float>(u.data(), n),
                         emulator::MufuInputs{std::span<const float>(s.data(), n), c, m}, first_key,
                         std::span<float>(value.data(), n), block);
    for (int j = 0; j < n; ++j) {
      const int code = encode_rne_sat(ElemFormat::e4m3, value[j]);
      const double exact = std::exp2(double{s[j]} * c - m + kFp8Offset);
      if (direct_p::sm90_fp8_key_on_mufu(first_key + j)) {
        ++mufu_keys;
        EXPECT_EQ(code, encode_rne_sat(ElemFormat::e4m3, emulator::ex2::sm90(x[j])));
        mufu_differs_from_curve += code != direct_p::fp8_code(u[j]);
        mufu.check(code, exact, u[j]);
      } else {
        ASSERT_EQ(code, direct_p::fp8_code(u[j])) << "key " << first_key + j;
        curve.check(code, exact, u[j]);
      }
    }
  }
  curve.report("sm90_fp8_row_agreement_curve");
  mufu.report("sm90_fp8_row_agreement_mufu");
  EXPECT_GT(mufu_keys, 0u);
  EXPECT_GT(mufu_differs_from_curve, 0u) << "the MUFU keys must not take the curve's codes";
}

// ---- FP4 P: MXFP4 --------------------------------------------------------------------

TEST(DirectP, Mxfp4ContractAndBlockMaximumNeverClipped) {
  std::mt19937_64 rng(77);
  std::uniform_real_distribution<float> block_max(-20.0f, 0.0f), below(0.0f, 12.0f);
  Contract contract("MXFP4 Direct-P (random blocks)", ElemFormat::e2m1);
  for (std::size_t i = 0; i < kRandomBlocks; ++i) {
    const float u_max = block_max(rng);
    const int e = direct_p::mx_block_exponent(u_max);
    // The block maximum lands in (3, 6]: never clipped, and the scale is the tightest one.
    const double top = std::exp2(double{u_max} - e);
    ASSERT_LE(top, 6.0 * (1 + kBoundaryBand)) << u_max;
    ASSERT_GT(top, 3.0 / (1 + kBoundaryBand)) << u_max;
    contract.check(direct_p::mxfp4_code(u_max, e), top, u_max);
    for (int k = 0; k < 32; ++k) {
      const float u = u_max - below(rng);
      contract.check(direct_p::mxfp4_code(u, e), std::exp2(double{u} - e), u);
    }
  }
  contract.report("mxfp4_agreement_random");
}

// The sm90 target's MXFP4 P row (the kernels' rule): keys from
// kSm90Mxfp4MufuFirstKey of every 128 on take the E2M1 code of
// ex2.approx(s·c − (m + E + 14)) truncated to fp16 (mxfp4_code_of_mufu),
// the others the curve. Both keep the contract; the row's values are the
// codes folded against R = −2, as the kernel folds them.
TEST(DirectP, Sm90Mxfp4RowSharesKeysWithMufuAndKeepsTheContract) {
  constexpr int kTile = 128, kRows = 20'000;
  const emulator::PConfig cfg{TensorFormat::mxfp4, Target::sm90, true, MxScaleRule::round_up};
  ASSERT_TRUE(emulator::mxfp4_mufu_share(cfg));
  ASSERT_GT(direct_p::kSm90Mxfp4MufuFirstKey, 0);
  ASSERT_LT(direct_p::kSm90Mxfp4MufuFirstKey, kTile);
  std::mt19937_64 rng(20261201);
  std::uniform_real_distribution<float> score(-3000.0f, 3000.0f);  // raw s: products of E4M3 codes
  std::uniform_real_distribution<float> log_c(-12.0f, -6.0f);
  Contract curve("sm90 MXFP4 P row, curve keys", ElemFormat::e2m1);
  Contract mufu("sm90 MXFP4 P row, MUFU keys", ElemFormat::e2m1);
  std::vector<float> s(kTile), u(kTile), value(kTile), block(kTile / 32 + 1);
  std::size_t mufu_keys = 0, mufu_differs_from_curve = 0;
  for (int row = 0; row < kRows; ++row) {
    const std::int64_t first_key = row % 2 == 0 ? 0 : 128 * 5;
    const float c = std::exp2(log_c(rng));
    float m = -INFINITY;
    for (int j = 0; j < kTile; ++j) m = std::max(m, (s[j] = score(rng)) * c);
    for (int j = 0; j < kTile; ++j) u[j] = direct_p::log2_score(s[j], c, m);
    emulator::make_p_row(cfg, std::span<const float>(u.data(), kTile),
                         emulator::MufuInputs{std::span<const float>(s.data(), kTile), c, m}, first_key,
                         std::span<float>(value.data(), kTile), block);
    for (int b0 = 0; b0 < kTile; b0 += 32) {
      float u_max = -INFINITY;
      for (int j = b0; j < b0 + 32; ++j) u_max = std::max(u_max, u[j]);
      const int e = direct_p::mx_block_exponent(u_max);
      for (int j = b0; j < b0 + 32; ++j) {
        int code;
        if (direct_p::sm90_mxfp4_key_on_mufu(first_key + j)) {
          ++mufu_keys;
          const float x = direct_p::log2_score(s[j], c, direct_p::mxfp4_mufu_shift(m, e));
          code = direct_p::mxfp4_code_of_mufu(emulator::ex2::sm90(x));
          mufu_differs_from_curve += code != direct_p::mxfp4_code(u[j], e);
          mufu.check(code, std::exp2(double{s[j]} * c - m - e), u[j]);
        } else {
          code = direct_p::mxfp4_code(u[j], e);
          curve.check(code, std::exp2(double{s[j]} * c - m - e), u[j]);
        }
        ASSERT_EQ(value[j], emulator::fold_mx_to_e4m3(decode(ElemFormat::e2m1, static_cast<std::uint8_t>(code)), e,
                                                      emulator::kSm90PRowExponent))
            << "key " << first_key + j;
      }
    }
  }
  curve.report("sm90_mxfp4_row_agreement_curve");
  mufu.report("sm90_mxfp4_row_agreement_mufu");
  EXPECT_GT(mufu_keys, 0u);
  EXPECT_GT(mufu_differs_from_curve, 0u) << "the MUFU keys must not take the curve's codes";
}

// mxfp4_code_of_mufu's rounding on fp16's grid: for p = 2^(v − 14) with exact
// exp2, the code is the E2M1 rounding of 2^v with ties up, at every midpoint
// and in the fp16 subnormals below 2^-14; f16_bits_rz truncates.
TEST(DirectP, Mxfp4MufuCodeRoundsOnTheFp16Grid) {
  EXPECT_EQ(direct_p::f16_bits_rz(0.0f), 0u);
  EXPECT_EQ(direct_p::f16_bits_rz(std::ldexp(1.0f, -24)), 1u);
  EXPECT_EQ(direct_p::f16_bits_rz(std::nextafter(std::ldexp(1.0f, -24), 0.0f)), 0u);
  EXPECT_EQ(direct_p::f16_bits_rz(std::ldexp(1.0f, -14)), 0x0400u);
  EXPECT_EQ(direct_p::f16_bits_rz(std::nextafter(std::ldexp(1.0f, -14), 0.0f)), 0x03FFu);
  EXPECT_EQ(direct_p::f16_bits_rz(std::nextafter(1.0f, 2.0f)), 0x3C00u);
  const float kGrid = std::ldexp(1.0f, -14);
  const float values[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  const float midpoints[7] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f};
  for (int k = 0; k < 8; ++k) EXPECT_EQ(direct_p::mxfp4_code_of_mufu(values[k] * kGrid), k);
  for (int k = 0; k < 7; ++k) {
    const float at = midpoints[k] * kGrid;
    EXPECT_EQ(direct_p::mxfp4_code_of_mufu(at), k + 1) << "tie at " << midpoints[k];
    EXPECT_EQ(direct_p::mxfp4_code_of_mufu(std::nextafter(at, 0.0f)), k) << "below " << midpoints[k];
  }
  EXPECT_EQ(direct_p::mxfp4_code_of_mufu(6.2f * kGrid), 7);
}

TEST(DirectP, Mxfp4ContractAcrossEveryThreshold) {
  Contract contract("MXFP4 Direct-P (threshold sweeps)", ElemFormat::e2m1);
  for (int e : {-9, -4, -1, 0}) {
    for (double b : boundaries_of(ElemFormat::e2m1)) {
      int last = -1;
      for (float u : sweep_around(std::log2(b) + e, kSweepHalfWidth)) {
        const int code = direct_p::mxfp4_code(u, e);
        ASSERT_GE(code, last) << "not monotone at u = " << u;
        last = code;
        contract.check(code, std::exp2(double{u} - e), u);
      }
    }
  }
  contract.report("mxfp4_agreement_thresholds");
}

// The curve behind mxfp4_code, over every fixed-point input a block can
// produce (u − E from below the smallest boundary up to log2 6): the code
// never decreases, stays ≤ 7 without the host's clamp (the kernel has none),
// the GPU's round-up add never carries out of its fp16 half, and each of the
// seven code changes sits within the contract's 1 % of the exact boundary.
TEST(DirectP, Mxfp4CurveBoundariesAndRange) {
  constexpr double kUnitsPerLog2 = 1 << direct_p::kFp8FixedFractionBits;
  const std::uint32_t x_max = direct_p::fixed_point(direct_p::kLog2Of6, direct_p::mxfp4_fixed_offset(0));
  std::uint32_t last = 0;
  int changes = 0;
  double worst = 0.0;
  for (std::uint32_t x = 0; x <= x_max; ++x) {
    const std::uint32_t rounded = direct_p::mxfp4_rounded_bits(x);
    ASSERT_LT(rounded, 0x1000u) << x;  // far from the high half (the GPU adds both halves at once)
    const std::uint32_t code = rounded >> direct_p::kE2M1CodeShift;
    ASSERT_GE(code, last) << "not monotone at x = " << x;
    if (code != last) {
      ASSERT_EQ(code, last + 1) << "skipped a code at x = " << x;
      // u − E whose fixed point is x − ½, i.e. where the code switches.
      const double switch_at = (x - 0.5 - direct_p::kMxfp4FixedBias) / kUnitsPerLog2;
      const double err = std::fabs(std::exp2(switch_at - double{direct_p::kE2M1Log2Bounds[changes]}) - 1.0);
      worst = std::max(worst, err);
      ++changes;
    }
    last = code;
  }
  EXPECT_EQ(changes, 7);
  EXPECT_EQ(last, 7u);  // 2^(log2 6) is code 7
  std::cout << "MXFP4 curve: largest boundary error " << 100 * worst << " % (x up to " << x_max << ")\n";
  RecordProperty("mxfp4_curve_boundary_error", std::to_string(worst));
  EXPECT_LT(worst, kBoundaryBand);
  EXPECT_GT(worst, 1e-3);  // an approximation: if it were exact, this test would measure nothing
}

// ---- FP4 P: NVFP4 --------------------------------------------------------------------

// The block scale s_b is the UE4M3 rounding of 2^(u_max + 8) / 6 (via the
// polynomial), so like the NVFP4 quantizer it may clip the block maximum by up
// to half a UE4M3 step (6.25 %), never by more.
TEST(DirectP, Nvfp4ContractOnRandomBlocks) {
  constexpr double kHalfUe4m3Step = 1.0 / 16;
  constexpr std::uint8_t kSmallestNormalUe4m3Code = 0x08;  // coarser subnormal scales may clip more
  std::mt19937_64 rng(91);
  std::uniform_real_distribution<float> block_max(-15.0f, 0.0f), below(0.0f, 10.0f);
  Contract scales("NVFP4 P block scale", ElemFormat::ue4m3);
  Contract elements("NVFP4 Direct-P (random blocks)", ElemFormat::e2m1);
  for (std::size_t i = 0; i < kRandomBlocks; ++i) {
    const float u_max = block_max(rng);
    const std::uint8_t sb_code = direct_p::nvfp4_block_scale(u_max);
    scales.check(sb_code, std::exp2(double{u_max} + kNvfp4Offset) / 6.0, u_max);
    if (sb_code == 0) continue;  // the whole block underflows UE4M3: P is zero there
    const double sb = decode(ElemFormat::ue4m3, sb_code);
    const float log2_sb = direct_p::log2_of_ue4m3(sb_code);
    const double top = std::exp2(double{u_max} + kNvfp4Offset) / sb;
    if (sb_code >= kSmallestNormalUe4m3Code) {
      ASSERT_LE(top, 6.0 * (1 + kHalfUe4m3Step) * (1 + kBoundaryBand)) << u_max;
    }
    for (int k = 0; k < 16; ++k) {
      const float u = k == 0 ? u_max : u_max - below(rng);
      elements.check(direct_p::nvfp4_code(u, log2_sb), std::exp2(double{u} + kNvfp4Offset) / sb, u);
    }
  }
  scales.report("nvfp4_scale_agreement_random");
  elements.report("nvfp4_agreement_random");
}

TEST(DirectP, Nvfp4ContractAcrossEveryThreshold) {
  Contract contract("NVFP4 Direct-P (threshold sweeps)", ElemFormat::e2m1);
  for (std::uint8_t sb_code : {std::uint8_t{0x08}, std::uint8_t{0x2B}, std::uint8_t{0x55}, std::uint8_t{0x7E}}) {
    const double sb = decode(ElemFormat::ue4m3, sb_code);
    const float log2_sb = direct_p::log2_of_ue4m3(sb_code);
    for (double b : boundaries_of(ElemFormat::e2m1)) {
      int last = -1;
      for (float u : sweep_around(std::log2(b * sb) - kNvfp4Offset, kSweepHalfWidth)) {
        const int code = direct_p::nvfp4_code(u, log2_sb);
        ASSERT_GE(code, last) << "not monotone at u = " << u;
        last = code;
        contract.check(code, std::exp2(double{u} + kNvfp4Offset) / sb, u);
      }
    }
  }
  contract.report("nvfp4_agreement_thresholds");
}

// The curve behind nvfp4_code for every finite UE4M3 scale, over every
// fixed-point input from below the smallest boundary up to the precondition
// w = u + 8 − log2 s_b ≤ 18: the code never decreases, never skips, ends at 7
// (the min at 6·2^-14 holds it there; the kernel has no other clamp), the
// GPU's round-up add never carries out of its fp16 half, and each of the
// seven code changes sits within the contract's 1 % of the exact boundary.
TEST(DirectP, Nvfp4CurveBoundariesEveryScale) {
  constexpr double kUnitsPerLog2 = 1 << direct_p::kFp8FixedFractionBits;
  constexpr float kHighestW = 18.0f;
  double worst = 0.0;
  int scales = 0;
  for (std::uint8_t sb_code = 1; sb_code <= spec_of(ElemFormat::ue4m3).max_code; ++sb_code) {
    const double log2_sb = std::log2(double{decode(ElemFormat::ue4m3, sb_code)});
    const float offset = direct_p::nvfp4_fixed_offset(direct_p::log2_of_ue4m3(sb_code));
    const double offset_units = float_bits(offset);
    // The addend is the bias plus 2^10·(8 − log2 s_b) to the nearest unit.
    ASSERT_LE(std::fabs(offset_units - direct_p::kNvfp4FixedBias - kUnitsPerLog2 * (kNvfp4Offset - log2_sb)), 0.5)
        << int(sb_code);
    const std::uint32_t x_max =
        direct_p::fixed_point(static_cast<float>(kHighestW + log2_sb) - kNvfp4Offset, offset);
    std::uint32_t last = 0;
    int changes = 0;
    for (std::uint32_t x = 0; x <= x_max; ++x) {
      const std::uint32_t rounded = direct_p::nvfp4_rounded_bits(x);
      ASSERT_LE(rounded, direct_p::kE2M1MaxValueBits + direct_p::kE2M1CodeRound) << x;  // no carry out of the half
      const std::uint32_t code = rounded >> direct_p::kE2M1CodeShift;
      ASSERT_GE(code, last) << "not monotone at x = " << x << ", scale " << int(sb_code);
      if (code != last) {
        ASSERT_EQ(code, last + 1) << "skipped a code at x = " << x << ", scale " << int(sb_code);
        // w whose fixed point is x − ½, i.e. where the code switches.
        const double switch_w = (x - 0.5 - offset_units) / kUnitsPerLog2 + kNvfp4Offset - log2_sb;
        const double err = std::fabs(std::exp2(switch_w - double{direct_p::kE2M1Log2Bounds[changes]}) - 1.0);
        worst = std::max(worst, err);
        ++changes;
      }
      last = code;
    }
    EXPECT_EQ(changes, 7) << int(sb_code);
    EXPECT_EQ(last, 7u) << int(sb_code);
    ++scales;
  }
  EXPECT_EQ(scales, 126);
  std::cout << "NVFP4 curve: largest boundary error " << 100 * worst << " % over " << scales << " scales\n";
  RecordProperty("nvfp4_curve_boundary_error", std::to_string(worst));
  EXPECT_LT(worst, kBoundaryBand);
  EXPECT_GT(worst, 1e-3);  // an approximation: if it were exact, this test would measure nothing
  // A zero scale: offset 0, so every u ≤ 0 has x = 0 and code 0.
  EXPECT_EQ(direct_p::nvfp4_fixed_offset(kNegInf), 0.0f);
  EXPECT_EQ(direct_p::nvfp4_code(0.0f, kNegInf), 0);
  EXPECT_EQ(direct_p::nvfp4_rounded_bits(direct_p::fixed_point(0.0f, 0.0f)) >> direct_p::kE2M1CodeShift, 0u);
}

// The BF16 operand q·s_b·2^-8 from the fp16 pattern c·2^9 of q·2^-14, for
// every E2M1 code and every UE4M3 scale, against the product computed directly.
TEST(DirectP, Nvfp4Bf16ValueIsCodeTimesScale) {
  for (std::uint32_t c = 0; c <= direct_p::kE2M1MaxCode; ++c)
    for (std::uint8_t sb_code = 0; sb_code <= spec_of(ElemFormat::ue4m3).max_code; ++sb_code) {
      const float sb = decode(ElemFormat::ue4m3, sb_code);
      const float want = decode(ElemFormat::e2m1, c) * sb / direct_p::kNvfp4OperandUnscale;  // exact: ≤ 6 bits
      ASSERT_EQ(float_bits(want) & 0xFFFFu, 0u) << c << " " << int(sb_code);
      const float scale = sb * exp2i(direct_p::kNvfp4Bf16ScaleExp);
      ASSERT_EQ(direct_p::nvfp4_bf16_value_bits(c << direct_p::kE2M1CodeShift, scale), float_bits(want) >> 16)
          << c << " " << int(sb_code);
    }
}

// Host model of the GPU's packed sequence for two scores of one block
// (device::nvfp4_q_pair, device::nvfp4_bf16_pair): the integer steps act on
// the whole 32-bit word as the GPU's do, so a carry or a shifted bit crossing
// between the halves would show here. Both halves must equal the scalar
// nvfp4_code and nvfp4_bf16_value_bits.
struct Nvfp4PackedModel {
  std::uint32_t q, value;
};
Nvfp4PackedModel nvfp4_packed_model(float lo, float hi, float offset, float scale_2pow116) {
  const auto per_half = [](std::uint32_t w, auto f) { return f(w & 0xFFFFu) | (f(w >> 16) << 16); };
  const std::uint32_t x = direct_p::fixed_point(lo, offset) | (direct_p::fixed_point(hi, offset) << 16);
  const std::uint32_t shifted = per_half(x, [](std::uint32_t h) { return (h + direct_p::kFp8HalfStep) & 0xFFFFu; });
  std::uint32_t v = 0;
  for (int half = 0; half < 2; ++half) {
    const std::uint32_t xh = (x >> (16 * half)) & 0xFFFFu, sh = (shifted >> (16 * half)) & 0xFFFFu;
    v |= direct_p::f16_bits_rne(fmaf(direct_p::f16_value(sh), direct_p::f16_value(direct_p::kF16InvSqrt2Bits),
                                     direct_p::f16_value(xh)))
         << (16 * half);
  }
  std::uint32_t sub = per_half(v, [](std::uint32_t h) {
    return direct_p::f16_bits_rne(direct_p::f16_value(h) * direct_p::f16_value(direct_p::kF16TwoPowMinus4Bits));
  });
  sub = per_half(sub, [](std::uint32_t h) { return std::min(h, direct_p::kE2M1MaxValueBits); });
  const std::uint32_t round_up = direct_p::kE2M1CodeRound * 0x10001u;
  const std::uint32_t mask = (~((direct_p::kE2M1CodeRound << 1) - 1u) & 0xFFFFu) * 0x10001u;
  const std::uint32_t q = (sub + round_up) & mask;
  const std::uint32_t b = q >> direct_p::kF16ToBf16Shift;  // one shift of the whole word
  const std::uint32_t value = per_half(b, [scale_2pow116](std::uint32_t h) {
    const float product = bits_float(h << 16) * bits_float(float_bits(scale_2pow116) & 0xFFFF0000u);
    return float_bits(product) >> 16;  // exact products: the bf16 multiply does not round
  });
  return {q, value};
}

TEST(DirectP, Nvfp4PackedMatchesScalar) {
  std::mt19937_64 rng(17);
  std::uniform_real_distribution<float> block_max(-15.0f, 0.0f), below(0.0f, 10.0f);
  std::size_t checked = 0;
  for (int i = 0; i < 200'000; ++i) {
    const float u_max = block_max(rng);
    const std::uint8_t sb_code = direct_p::nvfp4_block_scale(u_max);
    if (sb_code == 0) continue;
    const float log2_sb = direct_p::log2_of_ue4m3(sb_code);
    const float offset = direct_p::nvfp4_fixed_offset(log2_sb);
    const float scale = decode(ElemFormat::ue4m3, sb_code) * exp2i(direct_p::kNvfp4Bf16ScaleExp);
    const float u[2] = {i % 2 ? u_max : u_max - below(rng), i % 3 ? u_max - below(rng) : kNegInf};
    const Nvfp4PackedModel m = nvfp4_packed_model(u[0], u[1], offset, scale);
    for (int half = 0; half < 2; ++half) {
      const std::uint32_t q = (m.q >> (16 * half)) & 0xFFFFu;
      const std::uint32_t code = direct_p::nvfp4_code(u[half], log2_sb);
      ASSERT_EQ(q, code << direct_p::kE2M1CodeShift) << u[half] << " scale " << int(sb_code);
      ASSERT_EQ((m.value >> (16 * half)) & 0xFFFFu, direct_p::nvfp4_bf16_value_bits(q, scale)) << u[half];
      ++checked;
    }
  }
  EXPECT_GT(checked, 100'000u);
}

}  // namespace
}  // namespace fp4attn
