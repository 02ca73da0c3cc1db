// FP4 element and scale codes on the device, one value at a time in fp32:
// E2M1 codes, the MX (E8M0) scale rules and NVFP4's tensor and block scales,
// each equal bit for bit to its CPU rule in src/formats/quantize.cpp and
// include/fp4attn/formats.hpp (NOTES-fp4.md says how each was checked).
// e2m1_pairs.cuh is the packed bf16 / fp16 form of the MX code.
#pragma once

#include <cuda_fp8.h>

#include <cfloat>
#include <cstdint>

#include "cuda/quantize/segment.cuh"
#include "fp4attn/formats.hpp"

namespace fp4attn::cuda_quantize::fp4 {

inline constexpr std::uint32_t kMagnitudeMask = 0x7FFFFFFFu;
inline constexpr float kNvTensorScaleNumerator = kE2M1Max * kE4M3Max;  // 2688
inline constexpr std::uint32_t kE8M0MaxFinite = 254;

__device__ __forceinline__ std::uint32_t magnitude_bits(float x) { return __float_as_uint(x) & kMagnitudeMask; }

// E2M1 code of x, round to nearest even, saturating at ±6: formats.hpp's
// encode_rne_sat(e2m1, x) for every non-NaN float, in a few integer steps.
// Below 1 the grid is multiples of 0.5, and adding 1.5·2^22 (whose ulp is
// 0.5) rounds to it in the one IEEE addition; the low bits are then the
// code. From 1 up E2M1 keeps one mantissa bit: adding half an ulp of that
// bit less one, plus the bit itself, rounds the float's bits to nearest even
// (a carry moves into the exponent). Exponent and that bit, bits 22 and up,
// then count the E2M1 values from 1.0 (bits 0x3F8 << 22, code 2) on.
__device__ __forceinline__ std::uint32_t e2m1_code(float x) {
  constexpr float kHalfGridMagic = 0x1.8p22f;  // ulp 0.5
  constexpr std::uint32_t kOneBits = 0x3F800000u;
  constexpr std::uint32_t kBelowHalfUlp = (1u << 21) - 1u;  // mantissa bit 22 is E2M1's one bit
  constexpr std::uint32_t kCodeOfOne = 2;
  const std::uint32_t bits = __float_as_uint(x);
  const std::uint32_t a = bits & kMagnitudeMask;
  const std::uint32_t sign = (bits >> 28) & 8u;
  const std::uint32_t small = __float_as_uint(__fadd_rn(__uint_as_float(a), kHalfGridMagic)) -
                              __float_as_uint(kHalfGridMagic);
  const std::uint32_t t = a + kBelowHalfUlp + ((a >> 22) & 1u);
  const std::uint32_t large = min((t >> 22) - ((kOneBits >> 22) - kCodeOfOne), 7u);
  return sign | (a < kOneBits ? small : large);
}

// True when x lies within kNearBoundaryUlps float steps of an E2M1 rounding
// boundary (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5): from 1 up those have the
// low 22 bits 0x200000, below 1 the low 22 bits 0 (0.25 = 2^-2, 0.75).
// Some exact values below 1 (0.5, 0.375, …) pass too; they only cost a
// division.
inline constexpr std::uint32_t kNearBoundaryUlps = 8;
__device__ __forceinline__ bool near_e2m1_boundary(float x) {
  constexpr std::uint32_t kLow22 = (1u << 22) - 1u;
  constexpr std::uint32_t kOneBits = 0x3F800000u;
  const std::uint32_t a = __float_as_uint(x) & kMagnitudeMask;
  const std::uint32_t boundary = a < kOneBits ? 0u : 1u << 21;
  return ((a - boundary + kNearBoundaryUlps) & kLow22) <= 2 * kNearBoundaryUlps;
}

// fp4attn::mx_scale_code from the bits of a finite amax.
__device__ __forceinline__ std::uint32_t mx_scale_code(std::uint32_t amax_bits, bool round_up) {
  if (amax_bits == 0) return 0;
  constexpr std::uint32_t kImplicitOne = 1u << 23;
  constexpr std::uint32_t kOnePointFive = kImplicitOne | (kImplicitOne >> 1);
  int e;
  std::uint32_t significand;
  if (amax_bits >= kImplicitOne) {
    e = static_cast<int>(amax_bits >> 23) - 127;
    significand = (amax_bits & (kImplicitOne - 1u)) | kImplicitOne;
  } else {  // subnormal: the leading one at bit 31 − clz is worth 2^(31 − clz − 149)
    const int lz = __clz(amax_bits);
    e = -118 - lz;
    significand = amax_bits << (lz - 8);
  }
  const int k = round_up && significand > kOnePointFive ? e - 1 : e - 2;
  return static_cast<std::uint32_t>(min(max(k + kE8M0Bias, 0), static_cast<int>(kE8M0MaxFinite)));
}

__device__ __forceinline__ float nv_tensor_scale(std::uint32_t amax_bits) {
  const float amax = __uint_as_float(amax_bits);
  return amax == 0.0f ? 1.0f : fminf(__fdiv_rn(kNvTensorScaleNumerator, amax), FLT_MAX);
}

__device__ __forceinline__ std::uint32_t nv_scale_code(float block_amax, float s_enc) {
  // UE4M3 is E4M3 without the sign; the value is non-negative, and the
  // hardware's satfinite conversion is formats.hpp's rule (DESIGN §3.1).
  return __nv_cvt_float_to_fp8(__fdiv_rn(__fmul_rn(block_amax, s_enc), kE2M1Max), __NV_SATFINITE, __NV_E4M3);
}

// Multiplying by the reciprocal stands in for the IEEE division of the CPU
// rule: y = fl(p · fl(1/sb)) is within two roundings of 2^-24 of p / sb,
// and fl(p / sb) within one more, so the two lie less than three float steps
// apart (measured in the smaller step where a power of two falls between
// them). E2M1 is monotone in |x|: unless y is within kNearBoundaryUlps steps
// of a rounding boundary, both have the same code; near one, the quotient
// is divided for real.
struct NvDivisor {
  float sb, r;
};

__device__ __forceinline__ NvDivisor make_nv_divisor(std::uint32_t scale_code) {
  const float sb = decode(ElemFormat::ue4m3, scale_code);
  return {sb, sb == 0.0f ? 0.0f : __frcp_rn(sb)};  // sb ≥ 2^-9 when non-zero: r is finite
}

// Codes of x[first .. first + count) into 4-bit fields of words (element
// i at nibble i of the run). The rare divisions run after the loop, so the
// common path has no branch per element.
template <int kCount, int N>
__device__ __forceinline__ void nv_codes(const float (&x)[N], int first, float s_enc, const NvDivisor& div,
                                         std::uint32_t* words) {
  if (div.sb == 0.0f) return;  // the CPU writes +0 for a zero scale; words start at 0
  float p[kCount], y[kCount];
  bool near = false;
#pragma unroll
  for (int i = 0; i < kCount; ++i) {
    p[i] = __fmul_rn(x[first + i], s_enc);
    y[i] = __fmul_rn(p[i], div.r);
    near |= near_e2m1_boundary(y[i]);
  }
  if (near)
#pragma unroll
    for (int i = 0; i < kCount; ++i)
      if (near_e2m1_boundary(y[i])) y[i] = __fdiv_rn(p[i], div.sb);
#pragma unroll
  for (int i = 0; i < kCount; ++i) words[(first + i) / kSegment] |= e2m1_code(y[i]) << (4 * ((first + i) % kSegment));
}

}  // namespace fp4attn::cuda_quantize::fp4
