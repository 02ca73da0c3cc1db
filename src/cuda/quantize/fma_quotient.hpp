// The IEEE fp32 quotient x / s from one reciprocal product and one FMA
// correction, for many x over one s:
//   r = RN(1 / s), q0 = RN(x · r), q1 = RN(q0 − RN(s · q0 − x) · r)
// with both steps of q1 fused multiply-adds. The residual is formed as
// s · q0 − x and negated in the second step, not as x − s · q0: the two are
// equal but for the sign of an exact zero, and only this order keeps x = −0
// at −0 (−0 + +0 is +0 in round-to-nearest). q1 equals RN(x / s), checked on
// the CPU (tests/test_fma_quotient.cpp) for every bf16 and fp16 significand
// of x against every fp32 significand of s, for every fp32 significand of x
// against 1025 evenly spaced and the extreme significands of s, and on random
// pairs; every operation scales exactly by powers of two while nothing
// underflows or overflows, so significands decide. That range is what
// fma_quotient_exact_for asks of s: with |x| ≤ 449·s (the quantizer's blocks)
// and s in [2^-60, 2^60], every x whose quotient reaches 2^-11 keeps x, q0 and
// the residual far from the subnormals, and smaller quotients, wherever they
// round, stay below E4M3's first rounding boundary 2^-10.
// Host and device: the GPU quantizer uses it, the CPU test checks it.
#pragma once

#include <cmath>

#include "fp4attn/formats.hpp"

namespace fp4attn::cuda_quantize {

FP4ATTN_HD inline bool fma_quotient_exact_for(float s) { return s >= 0x1p-60f && s <= 0x1p60f; }

// x / s given r = RN(1 / s).
FP4ATTN_HD inline float fma_quotient(float x, float s, float r) {
#ifdef __CUDA_ARCH__
  const float q0 = __fmul_rn(x, r);
  return __fmaf_rn(-__fmaf_rn(s, q0, -x), r, q0);
#else
  const float q0 = x * r;
  return std::fma(-std::fma(s, q0, -x), r, q0);
#endif
}

// x / s for a divisor s with at most four significant bits (a UE4M3 scale:
// significand 1 + k/8), given its reciprocal split as r_hi = RD(1 / s) (the
// largest float not above it) and r_lo = RN(1 / s − r_hi) ≥ 0:
// RN(x · r_hi + RN(x · r_lo)), one multiply and one fused multiply-add where
// fma_quotient takes three. This correctly rounded multiplication by the
// constant 1 / s holds for some constants only; for the eight significands
// of s (and for 6) it holds at every x significand (tests/test_fma_quotient.cpp
// checks all 2^23 against each), and scaling by powers of two keeps it while
// x · r_lo stays normal: for the quantizer's s in [2^-9, 448], every x whose
// quotient reaches 2^-11. r_hi rounded down makes r_lo non-negative, so x · r_lo
// has x's sign and the sum keeps the sign of a zero x (with r_hi = RN(1 / s),
// above 1 / s for all seven non-powers of two, −0 came out +0).
FP4ATTN_HD inline float split_reciprocal_quotient(float x, float r_hi, float r_lo) {
#ifdef __CUDA_ARCH__
  return __fmaf_rn(x, r_hi, __fmul_rn(x, r_lo));
#else
  return std::fma(x, r_hi, x * r_lo);
#endif
}

// r_lo of split_reciprocal_quotient from s and r_hi = RD(1 / s): 1 − s · r_hi
// is exact in one fused multiply-add (a multiple of s's and r_hi's last bits,
// in [0, 2^-23)), so its IEEE quotient by s is RN(1 / s − r_hi).
FP4ATTN_HD inline float reciprocal_tail(float s, float r_hi) {
#ifdef __CUDA_ARCH__
  return __fdiv_rn(__fmaf_rn(-s, r_hi, 1.0f), s);
#else
  return std::fma(-s, r_hi, 1.0f) / s;
#endif
}

}  // namespace fp4attn::cuda_quantize
