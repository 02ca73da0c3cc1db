// Direct-P: attention scores mapped straight to the codes of the format that the
// P·V product consumes (DESIGN §3.3). Shared verbatim by the CPU emulator and the
// CUDA kernels, so both produce the same codes bit for bit.
//
// Inputs are log2-domain scores u = (s·scale − m)·log2(e) ≤ 0, m the running row
// maximum. Every product that could be fused differently by host and device
// compilers is written as an explicit fmaf, so the result does not depend on
// -ffp-contract or --fmad.
#pragma once

#include <cmath>
#include <cstdint>

#include "fp4attn/formats.hpp"

namespace fp4attn::direct_p {

inline constexpr float kLog2e = 1.4426950408889634f;
// FP8 P is 2^(u + 8): the row maximum maps to 256, so P stays in (0, 256] and
// uses E4M3's top binades instead of squeezing probabilities into [0, 1].
inline constexpr float kFp8Offset = 8.0f;
// Same offset for NVFP4 P, so its E4M3 block scales (P_max / 6 ≤ 42.7) sit
// well inside E4M3's range.
inline constexpr float kNvfp4Offset = 8.0f;

// 1.5·2^23: adding it to |x| < 2^22 rounds x to the nearest integer in the low
// mantissa bits (round to nearest even), an FADD instead of an FRND.
inline constexpr float kRoundMagic = 12582912.0f;
// Below 2^-12 every format's code is zero (E4M3's smallest step is 2^-9);
// clamping keeps the exponent arithmetic in the normal float range.
inline constexpr float kMinExp2Arg = -12.0f;
// Degree-2 fit of 2^f on [-0.5, 0.5]; max relative error 1.73e-3, far below the
// 1 % band of the Direct-P contract and the 6 % spacing of E4M3 codes.
inline constexpr float kExp2C0 = 0x1.001d08p+0f;
inline constexpr float kExp2C1 = 0x1.6829a8p-1f;
inline constexpr float kExp2C2 = 0x1.e84bbep-3f;

// log2-domain score: u = s·scale_log2 − m_log2, one FFMA.
FP4ATTN_HD inline float log2_score(float s, float scale_log2, float m_log2) {
  return fmaf(s, scale_log2, -m_log2);
}

// ≈ 2^t for t ≤ 128 as a float, from round(t) and a quadratic of the remainder:
// 3 FADD + 2 FFMA + 2 integer ops, no MUFU. Returns 2^-12-ish for t < -12.
FP4ATTN_HD inline float exp2_poly(float t) {
  t = t > kMinExp2Arg ? t : kMinExp2Arg;
  const float r = t + kRoundMagic;
  const float j = r - kRoundMagic;
  const std::int32_t ji = static_cast<std::int32_t>(float_bits(r) - float_bits(kRoundMagic));
  const float f = t - j;  // in [-0.5, 0.5]
  const float p = fmaf(fmaf(kExp2C2, f, kExp2C1), f, kExp2C0);
  return bits_float(float_bits(p) + (static_cast<std::uint32_t>(ji) << 23));
}

// E4M3 code of a positive float p < 464 whose E4M3 value is normal or subnormal,
// by integer bit moves (no F2FP): normal range rounds half up on the dropped
// bits (differs from RNE only on exact ties, which the polynomial never hits
// deliberately); the subnormal range rounds with the magic-number add.
FP4ATTN_HD inline std::uint8_t e4m3_code_of_positive(float p) {
  constexpr std::uint32_t kRebias = static_cast<std::uint32_t>(127 - 7) << 23;  // float bias -> E4M3 bias
  constexpr std::uint32_t kHalfDropped = 1u << 19;                              // half of the 20 dropped bits
  constexpr float kSubnormalScale = 512.0f;                                     // 1 / 2^-9, E4M3's smallest step
  const std::uint32_t pb = float_bits(p);
  if (p >= exp2i(-6)) return static_cast<std::uint8_t>((pb + kHalfDropped - kRebias) >> 20);
  return static_cast<std::uint8_t>(float_bits(fmaf(p, kSubnormalScale, kRoundMagic)) - float_bits(kRoundMagic));
}

// FP8 Direct-P: the E4M3 code of P = 2^(u + 8), u ≤ 0 (u = -inf gives code 0).
FP4ATTN_HD inline std::uint8_t fp8_code(float u) { return e4m3_code_of_positive(exp2_poly(u + kFp8Offset)); }

// Round-to-nearest baseline (Direct-P off): exact-ish exp2 then the ordinary
// E4M3 quantizer. Host uses exp2f; device kernels use ex2.approx, so this path
// is compared within tolerance, not bitwise.
FP4ATTN_HD inline std::uint8_t fp8_code_exp2(float u) {
  return encode_rne_sat(ElemFormat::e4m3, exp2f(u + kFp8Offset));
}

// ---- FP4 P -----------------------------------------------------------------
// log2 of the E2M1 rounding boundaries 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5:
// code k is chosen when v = u − E has crossed k of them.
inline constexpr float kE2M1Log2Bounds[7] = {
    -2.0f, -0.415037499278843818f, 0.321928094887362348f, 0.807354922057604107f,
    1.321928094887362348f, 1.807354922057604107f, 2.321928094887362348f};
inline constexpr float kLog2Of6 = 2.584962500721156181f;
inline constexpr int kNoBlockExponent = -127;  // block that holds only masked scores

// E2M1 code of 2^v by seven comparisons (v = -inf gives 0).
FP4ATTN_HD inline std::uint8_t e2m1_code_of_exp2(float v) {
  std::uint8_t code = 0;
#if defined(__CUDACC__)
#pragma unroll
#endif
  for (int i = 0; i < 7; ++i) code += v >= kE2M1Log2Bounds[i] ? 1 : 0;
  return code;
}

// MXFP4 P block exponent: E = ceil(u_max − log2 6), so the block maximum 2^u_max
// maps to (3, 6] and is never clipped. Clamped to E8M0's range.
FP4ATTN_HD inline int mx_block_exponent(float u_max) {
  if (!(u_max > -1e30f)) return kNoBlockExponent;
  const int e = static_cast<int>(ceilf(u_max - kLog2Of6));
  return e < kNoBlockExponent ? kNoBlockExponent : e;
}

// MXFP4 P element code for score u in a block with exponent E; value q·2^E.
FP4ATTN_HD inline std::uint8_t mxfp4_code(float u, int block_exp) {
  return e2m1_code_of_exp2(u - static_cast<float>(block_exp));
}

// NVFP4 P block scale: UE4M3 code of 2^(u_max + 8) / 6 (0 for a fully masked
// block). The element value is q·s_b·2^-8.
FP4ATTN_HD inline std::uint8_t nvfp4_block_scale(float u_max) {
  constexpr float kInv6 = 1.0f / 6.0f;
  if (!(u_max > -1e30f)) return 0;
  return encode_rne_sat(ElemFormat::ue4m3, exp2_poly(u_max + kNvfp4Offset) * kInv6);
}

// log2 of a finite UE4M3 value (exact to float precision); -inf for the zero
// scale of an all-underflow block, whose codes then all compare to 0.
FP4ATTN_HD inline float log2_of_ue4m3(std::uint8_t code) {
  constexpr float kLog2OnePlusEighths[8] = {0.0f, 0.169925001442312f, 0.321928094887362f, 0.459431618637297f,
                                            0.584962500721156f, 0.700439718141092f, 0.807354922057604f,
                                            0.906890595608519f};
  const int ef = (code >> 3) & 0xF;
  const int m = code & 7;
  if (ef == 0 && m == 0) return -bits_float(0x7F800000u);
  if (ef == 0) return static_cast<float>(floor_log2(static_cast<float>(m))) - 9.0f +
                      kLog2OnePlusEighths[(m << (3 - floor_log2(static_cast<float>(m)))) & 7];
  return static_cast<float>(ef - 7) + kLog2OnePlusEighths[m];
}

// NVFP4 P element code: E2M1 rounding of 2^(u + 8) / s_b, by thresholds.
// A zero block scale (log2 = -inf) gives code 0: the block underflowed.
FP4ATTN_HD inline std::uint8_t nvfp4_code(float u, float log2_block_scale) {
  if (!(log2_block_scale > -1e30f)) return 0;
  return e2m1_code_of_exp2(u + kNvfp4Offset - log2_block_scale);
}

}  // namespace fp4attn::direct_p
