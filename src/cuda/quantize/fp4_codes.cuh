// FP4 element and scale codes on the device, one value at a time in fp32:
// E2M1 codes, the MX (E8M0) scale rules and NVFP4's tensor and block scales,
// each equal bit for bit to its CPU rule in src/formats/quantize.cpp and
// include/fp4attn/formats.hpp (NOTES-fp4.md says how each was checked).
// e2m1_pairs.cuh is the packed bf16 / fp16 form of the MX code.
#pragma once

#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cfloat>
#include <cstdint>

#include "cuda/quantize/fma_quotient.hpp"

#include "cuda/quantize/segment.cuh"
#include "fp4attn/formats.hpp"

namespace fp4attn::cuda_quantize::fp4 {

inline constexpr std::uint32_t kMagnitudeMask = 0x7FFFFFFFu;
inline constexpr float kNvTensorScaleNumerator = kE2M1Max * kE4M3Max;  // 2688
inline constexpr std::uint32_t kE8M0MaxFinite = 254;

__device__ __forceinline__ std::uint32_t magnitude_bits(float x) { return __float_as_uint(x) & kMagnitudeMask; }

// m[0] = max.NaN of m[0 .. 2W), halving the width each level (a template
// level per step: ptxas kept a loop over the levels rolled, and m in local
// memory).
template <int W, int N>
__device__ __forceinline__ void nan_max_tree(float (&m)[N]) {
#pragma unroll
  for (int t = 0; t < W; ++t) asm("max.NaN.f32 %0, %1, %2;" : "=f"(m[t]) : "f"(m[t]), "f"(m[t + W]));
  if constexpr (W > 1) nan_max_tree<W / 2>(m);
}

// Bits of the largest |v[t]| of the N values from kFirst on, by a tree of
// max.NaN.f32 on magnitudes (FMNMX with |·| operands: one instruction per
// value, where the max of magnitude_bits takes a mask and half a 3-way max).
// For finite values and infinities the same bits as that max (|−0| = +0);
// a NaN anywhere gives the canonical NaN, above kInfBits as a NaN's
// magnitude bits are.
// (v by reference, the range at compile time: a pointer into it would put
// the caller's array in local memory.)
template <int N, int kFirst, int M>
__device__ __forceinline__ std::uint32_t abs_max_bits(const float (&v)[M]) {
  static_assert(N > 0 && (N & (N - 1)) == 0 && kFirst + N <= M, "a power of two inside v");
  float m[N];
#pragma unroll
  for (int t = 0; t < N; ++t) m[t] = fabsf(v[kFirst + t]);
  nan_max_tree<N / 2>(m);
  return __float_as_uint(m[0]);
}

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

// 1 / 6 split as split_reciprocal_quotient takes it (6 = 1.5 · 4): RD(1 / 6)
// and RN(1 / 6 − RD(1 / 6)), both checked by tests/test_fma_quotient.cpp.
inline constexpr float kE2M1MaxReciprocalHi = 0x1.555554p-3f;
inline constexpr float kE2M1MaxReciprocalLo = 0x1.555556p-27f;

__device__ __forceinline__ std::uint32_t nv_scale_code(float block_amax, float s_enc) {
  // UE4M3 is E4M3 without the sign; the value is non-negative, and the
  // hardware's satfinite conversion is formats.hpp's rule (DESIGN §3.1).
  // The CPU's fl(m / 6) by split_reciprocal_quotient (two instructions where
  // __fdiv_rn takes eight and a branch): m = fl(amax · S_enc) ≤ 2688, so
  // every quotient from 2^-11 up is the IEEE one, and smaller ones, exact or
  // not, stay below E4M3's first rounding boundary 2^-10 (fma_quotient.hpp;
  // GpuFp4Codes.NvScaleCodeMatchesTheCpuOnEveryProduct checks every m).
  return __nv_cvt_float_to_fp8(
      split_reciprocal_quotient(__fmul_rn(block_amax, s_enc), kE2M1MaxReciprocalHi, kE2M1MaxReciprocalLo),
      __NV_SATFINITE, __NV_E4M3);
}

// The value of a UE4M3 code below 0x7F, by the hardware's exact E4M3 → f16
// conversion (every E4M3 value is an f16).
__device__ __forceinline__ float ue4m3_value(std::uint32_t code) {
  return __half2float(__half(__nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(code), __NV_E4M3)));
}

// The IEEE division of the CPU rule, fl(p / sb), as split_reciprocal_quotient
// (fma_quotient.hpp): sb is UE4M3 (four significant bits, in [2^-9, 448]),
// and quotients below E2M1's first boundary 0.25 round to 0 wherever they
// land. r_hi = 0 stands for a zero scale.
struct NvDivisor {
  float r_hi, r_lo;
};

__device__ __forceinline__ NvDivisor make_nv_divisor(std::uint32_t scale_code) {
  const float sb = ue4m3_value(scale_code);
  if (sb == 0.0f) return {0.0f, 0.0f};
  const float r_hi = __frcp_rd(sb);  // sb ≥ 2^-9: finite
  return {r_hi, reciprocal_tail(sb, r_hi)};
}

// make_nv_divisor of every UE4M3 code, for kernels that look the divisor up
// (one shared-memory load per block where decoding and two reciprocals take
// about thirty instructions and branches). Entry 0x7F (NaN) is never read:
// the scale codes come from a satfinite conversion.
inline constexpr int kUe4m3Codes = 128;
struct NvDivisorTable {
  float2 entry[kUe4m3Codes];  // (r_hi, r_lo), as NvDivisor
  __device__ void fill(int thread, int threads) {
    for (int c = thread; c < kUe4m3Codes; c += threads) {
      const NvDivisor d = make_nv_divisor(static_cast<std::uint32_t>(c));
      entry[c] = make_float2(d.r_hi, d.r_lo);
    }
  }
  __device__ NvDivisor operator[](std::uint32_t code) const {
    const float2 e = entry[code];
    return {e.x, e.y};
  }
};

// fl(fl(x · S_enc) / sb): the NVFP4 quotient an element's code rounds.
__device__ __forceinline__ float nv_quotient(float x, float s_enc, const NvDivisor& div) {
  return split_reciprocal_quotient(__fmul_rn(x, s_enc), div.r_hi, div.r_lo);
}

// Codes of x[first .. first + count) into 4-bit fields of words (element
// i at nibble i of the run); no branch per element.
template <int kCount, int N>
__device__ __forceinline__ void nv_codes(const float (&x)[N], int first, float s_enc, const NvDivisor& div,
                                         std::uint32_t* words) {
  if (div.r_hi == 0.0f) return;  // the CPU writes +0 for a zero scale; words start at 0
#pragma unroll
  for (int i = 0; i < kCount; ++i)
    words[(first + i) / kSegment] |= e2m1_code(nv_quotient(x[first + i], s_enc, div)) << (4 * ((first + i) % kSegment));
}

}  // namespace fp4attn::cuda_quantize::fp4
