#include "emulator/tensor_core.hpp"

#include <algorithm>

#include "fp4attn/formats.hpp"

namespace fp4attn::emulator {
namespace {

constexpr int kFloatMantissaBits = 23;
constexpr int kFloatBias = 127;
constexpr std::uint32_t kFloatExponentMask = 0xFFu;
// E4M3 subnormals are aligned like the smallest normal binade.
constexpr float kE4m3MinExponent = -6.0f;
// A zero operand: far enough below every real exponent that a product with it
// never sets emax, not even against the smallest accumulator the model takes.
constexpr float kZeroExponent = -1000.0f;
// Floor of emax, so that 2^(kAlignFractionBits − emax) stays a finite float.
constexpr float kMinAlignExponent = -100.0f;
// Addends keep their bits down to 2^(emax − 13).
constexpr int kAlignFractionBits = 13;
// The result keeps 14 significant bits (13 after the leading one): the low 10
// of fp32's 23 mantissa bits are cleared.
constexpr int kResultFractionBits = 13;
constexpr std::uint32_t kDroppedResultBits = (1u << (kFloatMantissaBits - kResultFractionBits)) - 1u;
// bits(2^-e) = kReciprocalBits − bits(2^e) for a normal power of two.
constexpr std::uint32_t kReciprocalBits = static_cast<std::uint32_t>(2 * kFloatBias) << kFloatMantissaBits;

float binade(float x) {
  return static_cast<float>(static_cast<int>((float_bits(x) >> kFloatMantissaBits) & kFloatExponentMask) - kFloatBias);
}

// 2^e for an integer-valued e in the normal range.
float pow2(float e) {
  return bits_float(static_cast<std::uint32_t>(static_cast<int>(e) + kFloatBias) << kFloatMantissaBits);
}

// Truncation toward zero of an integer-valued float below 2^31 in magnitude.
float trunc_small(float x) { return static_cast<float>(static_cast<std::int32_t>(x)); }

}  // namespace

float e4m3_exponent(float x) { return x == 0.0f ? kZeroExponent : std::max(binade(x), kE4m3MinExponent); }

void e4m3_exponents(const float* x, std::int64_t n, float* exponents) {
  for (std::int64_t i = 0; i < n; ++i) exponents[i] = e4m3_exponent(x[i]);
}

void fp8_mma_step(const float* a, const float* a_exp, const float* b, const float* b_exp, std::int64_t b_stride,
                  int terms, std::int64_t count, float* acc, float* scratch) {
  float* scale = scratch;          // 2^(13 − emax): one unit of the aligned sum becomes 1
  float* sum = scratch + count;    // the aligned, truncated addends, summed exactly (< 2^21)
  // emax over the accumulator and every product.
  for (std::int64_t n = 0; n < count; ++n)
    scale[n] = acc[n] == 0.0f ? kMinAlignExponent : std::max(binade(acc[n]), kMinAlignExponent);
  for (int k = 0; k < terms; ++k) {
    const float ae = a_exp[k];
    const float* be = b_exp + k * b_stride;
    for (std::int64_t n = 0; n < count; ++n) scale[n] = std::max(scale[n], ae + be[n]);
  }
  for (std::int64_t n = 0; n < count; ++n) {
    scale[n] = pow2(static_cast<float>(kAlignFractionBits) - scale[n]);
    sum[n] = trunc_small(acc[n] * scale[n]);
  }
  // Products are exact in fp32 (E4M3 × E4M3 has at most 8 significant bits)
  // and scaling by a power of two keeps them exact, so each truncation here
  // is the hardware's, and the float sum of integers below 2^21 is exact.
  for (int k = 0; k < terms; ++k) {
    const float av = a[k];
    if (av == 0.0f) continue;  // adds zeros only
    const float* bv = b + k * b_stride;
    for (std::int64_t n = 0; n < count; ++n) sum[n] += trunc_small(av * bv[n] * scale[n]);
  }
  for (std::int64_t n = 0; n < count; ++n) {
    const float unscaled = sum[n] * bits_float(kReciprocalBits - float_bits(scale[n]));
    acc[n] = bits_float(float_bits(unscaled) & ~kDroppedResultBits);
  }
}

bool uses_fp8_mma_model(const AttentionOptions& opt) {
  return opt.accumulation == Accumulation::tensor_core && opt.target == Target::sm90 &&
         spec_of(opt.recipe).qk != TensorFormat::nvfp4;
}

}  // namespace fp4attn::emulator
