// E4M3 codes of x / s, equal bit for bit to the CPU quantizer's
// encode_rne_sat(e4m3, x / s) with an IEEE fp32 division, at the cost of a
// multiplication in all but a few cases per million.
//
// Why it is exact. Let q = x / s (real), Q = fl(q) the IEEE quotient and
// f = E4M3 round-to-nearest-even with saturation: f is monotone, and the
// hardware cvt.rn.satfinite.e4m3x2.f32 equals formats.hpp's rule for every
// float (DESIGN §3.1). With r = fl(1/s), the products
//   shrunk = fl(x · fl(r · (1 − 2^-20))),  grown = fl(x · fl(r · (1 + 2^-20)))
// each carry at most three roundings of relative size 2^-24 on top of the
// ±2^-20 factor, so |shrunk| < |q|·(1 − 2^-24) ≤ |Q| ≤ |q|·(1 + 2^-24) < |grown|
// (products below the float normal range are far below half the smallest
// E4M3 subnormal, 2^-10, and all round to a signed zero like Q). When
// f(shrunk) == f(grown), monotonicity gives f(Q) the same code. Otherwise Q
// lies within 2^-20 of a rounding boundary and is computed by a true IEEE
// division. For a scale below FLT_MIN, 1/s may overflow: the bracket is then
// [0, ∞), whose codes always differ, so every element takes the division.
#pragma once

#include <cuda_fp8.h>

#include <cfloat>
#include <cstdint>

namespace fp4attn::cuda_quantize {

inline constexpr float kBracketShrink = 1.0f - 0x1p-20f;
inline constexpr float kBracketGrow = 1.0f + 0x1p-20f;

// A scale prepared for many divisions.
struct E4M3Divisor {
  float s;
  float r_shrunk, r_grown;
};

__device__ __forceinline__ E4M3Divisor make_divisor(float s) {
  if (!(s >= FLT_MIN)) return {s, 0.0f, __int_as_float(0x7F800000)};
  const float r = __frcp_rn(s);
  return {s, __fmul_rn(r, kBracketShrink), __fmul_rn(r, kBracketGrow)};
}

// Two E4M3 codes, x0's in the low byte.
__device__ __forceinline__ std::uint32_t e4m3x2(float x0, float x1) {
  return __nv_cvt_float2_to_fp8x2(make_float2(x0, x1), __NV_SATFINITE, __NV_E4M3);
}

// Codes of x0 / d.s and x1 / d.s, x0's in the low byte.
__device__ __forceinline__ std::uint32_t e4m3x2_quotient(float x0, float x1, const E4M3Divisor& d) {
  const std::uint32_t shrunk = e4m3x2(__fmul_rn(x0, d.r_shrunk), __fmul_rn(x1, d.r_shrunk));
  const std::uint32_t grown = e4m3x2(__fmul_rn(x0, d.r_grown), __fmul_rn(x1, d.r_grown));
  if (shrunk == grown) return shrunk;
  return e4m3x2(__fdiv_rn(x0, d.s), __fdiv_rn(x1, d.s));
}

}  // namespace fp4attn::cuda_quantize
