// FastDiv (the GPU quantizer's block-index decode) against integer division.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>

#include "cuda/quantize/fast_div.hpp"

namespace fp4attn {
namespace {

using cuda_quantize::FastDiv;

void expect_divides(std::uint32_t d, std::uint32_t n) {
  if (n >= (1u << 31)) return;  // outside the documented range
  const FastDiv f(d);
  const std::uint32_t q = f.quotient(n);
  ASSERT_EQ(q, n / d) << "n=" << n << " d=" << d;
  ASSERT_EQ(f.remainder(n, q), n % d) << "n=" << n << " d=" << d;
}

TEST(FastDiv, SmallDivisorsEveryNumeratorUpTo2To16) {
  for (std::uint32_t d = 1; d <= 300; ++d)
    for (std::uint32_t n = 0; n < (1u << 16); ++n) expect_divides(d, n);
}

TEST(FastDiv, RandomDivisorsAndNumeratorsNearTheLimits) {
  std::mt19937 rng(std::random_device{}());
  std::uniform_int_distribution<std::uint32_t> divisor(1, (1u << 31) - 1), numerator(0, (1u << 31) - 1);
  for (int t = 0; t < 200000; ++t) {
    const std::uint32_t d = t % 2 ? divisor(rng) : divisor(rng) % 4096 + 1;
    expect_divides(d, numerator(rng));
    expect_divides(d, (1u << 31) - 1 - static_cast<std::uint32_t>(t));     // the largest numerators
    expect_divides(d, d * (numerator(rng) / d) + (t % 2 ? d - 1 : 0));   // at and just below multiples
  }
  for (std::uint32_t d : {1u, 2u, 3u, 7u, 128u, 129u, (1u << 30) + 1, (1u << 31) - 1})
    for (std::uint32_t n : {0u, 1u, d - 1, d, d + 1, (1u << 31) - 1}) expect_divides(d, n);
}

}  // namespace
}  // namespace fp4attn
