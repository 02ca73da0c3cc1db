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

}  // namespace fp4attn::cuda_quantize
