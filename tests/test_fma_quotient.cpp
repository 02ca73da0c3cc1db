// fma_quotient (the division of the GPU FP8 quantizer's codes) and
// split_reciprocal_quotient (NVFP4's, by UE4M3 scales) against the IEEE fp32
// quotient, computed as a double division rounded to
// float (exact: 53 bits hold every quotient of two 24-bit significands well
// enough that the second rounding cannot meet a false tie).
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <random>

#include "cuda/quantize/fma_quotient.hpp"
#include "fp4attn/formats.hpp"

namespace fp4attn {
namespace {

using cuda_quantize::fma_quotient;
using cuda_quantize::reciprocal_tail;
using cuda_quantize::split_reciprocal_quotient;

float ieee_quotient(float x, float s) { return static_cast<float>(static_cast<double>(x) / static_cast<double>(s)); }
// Bit equality, so that −0 and +0 differ (E4M3 and E2M1 keep the sign of zero).
bool same_bits(float a, float b) { return std::bit_cast<std::uint32_t>(a) == std::bit_cast<std::uint32_t>(b); }
float with_significand(std::uint32_t exponent_bits, std::uint32_t significand) {
  return std::bit_cast<float>(exponent_bits << 23 | significand);
}

// x / s for x with `x_bits` significand bits, at every such significand and
// two exponents (so both binades of the quotient), against s significands
// ms = first, first + step, ...
std::uint64_t count_wrong(int x_bits, std::uint32_t first, std::uint32_t step) {
  std::uint64_t wrong = 0;
  for (std::uint32_t ms = first; ms < (1u << 23); ms += step) {
    const float s = with_significand(127, ms), r = 1.0f / s;
    for (std::uint32_t mx = 0; mx < (1u << (x_bits - 1)); ++mx)
      for (std::uint32_t e : {127u, 128u}) {
        const float x = with_significand(e, mx << (24 - x_bits));
        wrong += !same_bits(fma_quotient(x, s, r), ieee_quotient(x, s));
      }
  }
  return wrong;
}

// Every bf16 significand of x against every 64th fp32 significand of s (the
// full sweep, every s, also gave no difference: 2^31 quotients, 5 s here).
TEST(FmaQuotient, Bf16SignificandsAgainstOneIn64Divisors) {
  EXPECT_EQ(count_wrong(8, 0, 64), 0u);
  EXPECT_EQ(count_wrong(8, 63, 64), 0u);
}

TEST(FmaQuotient, Fp16AndFp32SignificandsAgainstSampledDivisors) {
  EXPECT_EQ(count_wrong(11, 5, 4093), 0u);
  EXPECT_EQ(count_wrong(24, 0x7FFFFF, 1 << 23), 0u);  // s = 2 − 2^-23, every fp32 x significand
  EXPECT_EQ(count_wrong(24, 1, 1 << 23), 0u);         // s = 1 + 2^-23
}

// Random pairs over the exponent range the quantizer allows: s in
// [2^-60, 2^60], |x| up to 449·s and down to quotients of 2^-11.
TEST(FmaQuotient, RandomPairsInTheQuantizersRange) {
  std::mt19937 rng(std::random_device{}());
  std::uniform_int_distribution<std::uint32_t> significand(0, (1u << 23) - 1);
  std::uniform_int_distribution<int> s_exponent(-60, 59), q_exponent(-11, 8);
  std::uint64_t wrong = 0;
  for (int i = 0; i < 4000000; ++i) {
    const float s = with_significand(static_cast<std::uint32_t>(127 + s_exponent(rng)), significand(rng));
    const float x = (i % 2 ? -1.0f : 1.0f) *
                    with_significand(static_cast<std::uint32_t>(127 + q_exponent(rng)), significand(rng)) * s;
    ASSERT_TRUE(cuda_quantize::fma_quotient_exact_for(s));
    wrong += !same_bits(fma_quotient(x, s, 1.0f / s), ieee_quotient(x, s));
  }
  EXPECT_EQ(wrong, 0u);
}

// Zeros keep their sign, and quotients that underflow to zero take x's sign.
TEST(FmaQuotient, ZerosAndUnderflowKeepTheSign) {
  for (const float s : {0x1p-60f, 0x1.8p-9f, 1.0f, 448.0f, 0x1.fffffep59f}) {
    const float r = 1.0f / s;
    for (const float x : {0.0f, -0.0f, 0x1p-149f, -0x1p-149f, 0x1p-130f, -0x1p-130f}) {
      EXPECT_TRUE(same_bits(fma_quotient(x, s, r), ieee_quotient(x, s)))
          << "x = " << x << " s = " << s << " got " << fma_quotient(x, s, r);
    }
  }
}

// The comparison is not vacuous: the uncorrected product x · r differs from
// the quotient on many of the same pairs.
TEST(FmaQuotient, TheProductAloneIsOftenWrong) {
  std::uint64_t wrong = 0, total = 0;
  for (std::uint32_t ms = 0; ms < (1u << 23); ms += 4099) {
    const float s = with_significand(127, ms), r = 1.0f / s;
    for (std::uint32_t mx = 0; mx < 128; ++mx, ++total) {
      const float x = with_significand(127, mx << 16);
      wrong += x * r != ieee_quotient(x, s);
    }
  }
  EXPECT_GT(wrong, total / 100) << wrong << " of " << total;
}

// RD(1 / s), the r_hi of split_reciprocal_quotient.
float reciprocal_down(float s) {
  const float r = 1.0f / s;
  return static_cast<double>(r) > 1.0 / static_cast<double>(s) ? std::nextafter(r, 0.0f) : r;
}

// Every fp32 significand of x against each of the eight UE4M3 significands
// 1 + k/8 and against 6 (x in [1, 2): the quotient covers both its binades;
// other exponents scale exactly).
TEST(SplitReciprocalQuotient, EveryFp32SignificandByEveryUe4m3SignificandAndSix) {
  for (int k = 0; k <= 8; ++k) {
    const float s = k < 8 ? 1.0f + static_cast<float>(k) / 8.0f : 6.0f;
    const float r_hi = reciprocal_down(s), r_lo = reciprocal_tail(s, r_hi);
    ASSERT_GE(r_lo, 0.0f);
    std::uint64_t wrong = 0;
    for (std::uint32_t mx = 0; mx < (1u << 23); ++mx) {
      const float x = with_significand(127, mx);
      wrong += !same_bits(split_reciprocal_quotient(x, r_hi, r_lo), ieee_quotient(x, s));
    }
    EXPECT_EQ(wrong, 0u) << "s = " << s;
  }
  // The block scale's constants (fp4_codes.cuh).
  EXPECT_EQ(reciprocal_down(6.0f), 0x1.555554p-3f);
  EXPECT_EQ(reciprocal_tail(6.0f, 0x1.555554p-3f), 0x1.555556p-27f);
}

// Every UE4M3 scale (codes 1 .. 126) against random x whose quotient lies in
// [2^-11, 8), both signs, and signed zeros.
TEST(SplitReciprocalQuotient, EveryUe4m3ScaleOverTheQuotientsRange) {
  std::mt19937 rng(std::random_device{}());
  std::uniform_int_distribution<std::uint32_t> significand(0, (1u << 23) - 1);
  std::uniform_int_distribution<int> q_exponent(-11, 2);
  for (std::uint32_t code = 1; code < 127; ++code) {
    const float s = decode(ElemFormat::ue4m3, code), r_hi = reciprocal_down(s), r_lo = reciprocal_tail(s, r_hi);
    std::uint64_t wrong = 0;
    for (int i = 0; i < 20000; ++i) {
      const float q = with_significand(static_cast<std::uint32_t>(127 + q_exponent(rng)), significand(rng));
      const float x = (i % 2 ? -1.0f : 1.0f) * static_cast<float>(static_cast<double>(q) * s);
      wrong += !same_bits(split_reciprocal_quotient(x, r_hi, r_lo), ieee_quotient(x, s));
    }
    EXPECT_EQ(wrong, 0u) << "code " << code;
    for (const float x : {0.0f, -0.0f})
      EXPECT_TRUE(same_bits(split_reciprocal_quotient(x, r_hi, r_lo), x)) << "code " << code;
  }
}

}  // namespace
}  // namespace fp4attn
