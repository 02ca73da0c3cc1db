// E4M3 codes of x / s, equal bit for bit to the CPU quantizer's
// encode_rne_sat(e4m3, x / s) with an IEEE fp32 division. Two ways:
//  * e4m3x4_fma: the quotient from fma_quotient (a reciprocal product and
//    two FMAs, exact for s in [2^-60, 2^60]; fma_quotient.hpp), no branch.
//    The quantizer uses it for every block whose scale is in that range.
//  * the bracket below, at two multiplications per element except near
//    rounding boundaries, for the other scales. Exact ties are not rare:
//    with bf16 inputs x / s often lands on an E4M3 midpoint (the H200
//    profile of the quantizer saw about 0.3 % of elements take the
//    division), which is why callers batch the bracket test over many words.
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

#include "cuda/quantize/fma_quotient.hpp"

namespace fp4attn::cuda_quantize {

inline constexpr float kBracketShrink = 1.0f - 0x1p-20f;
inline constexpr float kBracketGrow = 1.0f + 0x1p-20f;

// A scale prepared for many divisions.
struct E4M3Divisor {
  float s;
  float r_shrunk, r_grown;
  float r;          // RN(1 / s)
  bool fma_exact;   // fma_quotient gives the IEEE quotient (fma_quotient.hpp)
};

__device__ __forceinline__ E4M3Divisor make_divisor(float s) {
  if (!(s >= FLT_MIN)) return {s, 0.0f, __int_as_float(0x7F800000), 0.0f, false};
  const float r = __frcp_rn(s);
  return {s, __fmul_rn(r, kBracketShrink), __fmul_rn(r, kBracketGrow), r, fma_quotient_exact_for(s)};
}

// Two E4M3 codes, x0's in the low byte.
__device__ __forceinline__ std::uint32_t e4m3x2(float x0, float x1) {
  return __nv_cvt_float2_to_fp8x2(make_float2(x0, x1), __NV_SATFINITE, __NV_E4M3);
}

// Four codes in one word (x0's in the low byte), from products by the two
// bracketing reciprocals. Equal words are the codes of the IEEE quotients.
struct E4M3Bracket {
  std::uint32_t shrunk, grown;
};

__device__ __forceinline__ E4M3Bracket e4m3x4_bracket(float x0, float x1, float x2, float x3, const E4M3Divisor& d) {
  return {e4m3x2(__fmul_rn(x0, d.r_shrunk), __fmul_rn(x1, d.r_shrunk)) |
              e4m3x2(__fmul_rn(x2, d.r_shrunk), __fmul_rn(x3, d.r_shrunk)) << 16,
          e4m3x2(__fmul_rn(x0, d.r_grown), __fmul_rn(x1, d.r_grown)) |
              e4m3x2(__fmul_rn(x2, d.r_grown), __fmul_rn(x3, d.r_grown)) << 16};
}

// Four codes of the IEEE quotients by one FMA-corrected product each
// (fma_quotient.hpp): no branch, for divisors with fma_exact.
__device__ __forceinline__ std::uint32_t e4m3x4_fma(float x0, float x1, float x2, float x3, const E4M3Divisor& d) {
  return e4m3x2(fma_quotient(x0, d.s, d.r), fma_quotient(x1, d.s, d.r)) |
         e4m3x2(fma_quotient(x2, d.s, d.r), fma_quotient(x3, d.s, d.r)) << 16;
}

// The same four codes from true IEEE divisions: for the rare word whose
// bracket straddles a rounding boundary. Callers test many words' brackets
// first and take this path once for all of them, so a warp pays one branch
// per batch of words, not one per pair.
__device__ __forceinline__ std::uint32_t e4m3x4_divided(float x0, float x1, float x2, float x3, const E4M3Divisor& d) {
  return e4m3x2(__fdiv_rn(x0, d.s), __fdiv_rn(x1, d.s)) | e4m3x2(__fdiv_rn(x2, d.s), __fdiv_rn(x3, d.s)) << 16;
}

}  // namespace fp4attn::cuda_quantize
