// MXFP4 codes of bf16 / fp16 inputs two at a time, in the inputs' own
// packed arithmetic (bf16x2, f16x2), equal to fp4attn::encode_rne_sat(e2m1,
// x · 2^-k) of the CPU quantizer.
//
// Why it is exact. x · 2^-k is exact in the input's format whenever 2^-k is a
// normal number of it (mx_pairs_apply says when): a bf16 / fp16 times a power
// of two needs no rounding, except below the normal range, where every value
// is far under 0.25, E2M1's first rounding boundary, and gets code 0 however
// it rounds. For a = |x · 2^-k| the E2M1 magnitude code n (the index of the
// value in 0, 0.5, 1, 1.5, 2, 3, 4, 6) is rint(f(a)) with
//   f(a) = min(2a, a + 2, a/2 + 4, 7),
// the piecewise-linear map through the grid points (slopes 2, 1, 1/2: f is
// concave, so it is the min of its pieces). rint ties to even, and the even
// indices are the values with an even mantissa, so a tie of f is a tie of
// E2M1 rounded the same way. rint is monotone, so rint(f) is the min of the
// rounded pieces. Each rounded piece is one fused operation with an even
// addend M (128 for bf16, 1024 for fp16, where the ulp is 1): fl(p + M) =
// M + rint(p) while p + M stays below 2M (a < 8 in a block), and its bits are
// those of M plus the integer, so the min of the pieces is an unsigned 16-bit
// min of their bits. Per pair: one multiply, three fused adds, two integer
// mins (the third operand is the saturation at 7).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "cuda/quantize/fp4_codes.cuh"
#include "fp4attn/formats.hpp"

namespace fp4attn::cuda_quantize::fp4 {

template <class T>
struct Pairs;

template <>
struct Pairs<__nv_bfloat16> {
  using H2 = __nv_bfloat162;
  static constexpr std::uint32_t kMagicBitsPair = 0x43004300u;  // M = 128 in both halves: ulp 1 in [128, 256)
  static constexpr std::uint32_t kTwoBitsPair = 0x40004000u, kHalfBitsPair = 0x3F003F00u;
  static constexpr int kMantissaBits = 7;
  // E8M0 codes whose 2^-k is a normal bf16 and whose blocks hold no value
  // that a flush of bf16 subnormals could move off code 0 (k ≥ −123).
  static constexpr std::uint32_t kMinScaleCode = 4, kMaxScaleCode = 253;
  __device__ static H2 splat(float f) { return __float2bfloat162_rn(f); }
  // Float bits of a 16-bit pattern (a magnitude, or a value with its sign).
  __device__ static std::uint32_t float_bits(std::uint32_t m) { return m << 16; }
};

template <>
struct Pairs<__half> {
  using H2 = __half2;
  static constexpr std::uint32_t kMagicBitsPair = 0x64006400u;  // M = 1024 in both halves: ulp 1 in [1024, 2048)
  static constexpr std::uint32_t kTwoBitsPair = 0x40004000u, kHalfBitsPair = 0x38003800u;
  static constexpr int kMantissaBits = 10;
  // 2^-k a normal fp16: −k in [−14, 15].
  static constexpr std::uint32_t kMinScaleCode = 112, kMaxScaleCode = 141;
  __device__ static H2 splat(float f) { return __float2half2_rn(f); }
  __device__ static std::uint32_t float_bits(std::uint32_t m) {
    return __float_as_uint(__half2float(__ushort_as_half(static_cast<unsigned short>(m))));
  }
};

// The CUDA pair types are not trivially copyable, so no bit_cast.
template <class H2>
__device__ __forceinline__ H2 as_pair(std::uint32_t w) {
  return *reinterpret_cast<const H2*>(&w);
}
template <class H2>
__device__ __forceinline__ std::uint32_t pair_bits(H2 h) {
  return *reinterpret_cast<const std::uint32_t*>(&h);
}

// True when the packed path is exact for a block with this E8M0 scale code.
template <class T>
__device__ __forceinline__ bool mx_pairs_apply(std::uint32_t scale_code) {
  return scale_code >= Pairs<T>::kMinScaleCode && scale_code <= Pairs<T>::kMaxScaleCode;
}

// 2^-k for scale code k + 127, in both halves.
template <class T>
__device__ __forceinline__ typename Pairs<T>::H2 mx_pair_scale(std::uint32_t scale_code) {
  return Pairs<T>::splat(exp2i(kE8M0Bias - static_cast<int>(scale_code)));
}

// Max of the 16-bit magnitudes of the two halves of each word, per half.
__device__ __forceinline__ std::uint32_t pair_magnitude_max(std::uint32_t acc, std::uint32_t w) {
  return __vmaxu2(acc, w & 0x7FFF7FFFu);
}

// Code bits of one pair before the final subtraction of pack_codes_x8:
// (bits(M) + n) | sign · 8 in each half, n the E2M1 magnitude code of that
// half of a (non-negative), the sign taken from bits 15 and 31 of
// `sign_word`. bits(M) has a zero low nibble, so the sign lands in bit 3 of a
// nibble that n (≤ 7) leaves free.
template <class T>
__device__ __forceinline__ std::uint32_t e2m1_code_bits_x2(typename Pairs<T>::H2 a, std::uint32_t sign_word) {
  using P = Pairs<T>;
  using H2 = typename P::H2;
  const H2 two = as_pair<H2>(P::kTwoBitsPair), half = as_pair<H2>(P::kHalfBitsPair);
  const H2 magic = as_pair<H2>(P::kMagicBitsPair), magic_plus_two = as_pair<H2>(P::kMagicBitsPair + 0x00020002u),
           magic_plus_four = as_pair<H2>(P::kMagicBitsPair + 0x00040004u);  // M + 2, M + 4: ulp 1
  constexpr std::uint32_t kSaturated = P::kMagicBitsPair + 0x00070007u;  // bits of M + 7, both halves
  const std::uint32_t n = __vimin3_u16x2(pair_bits(__hfma2(a, two, magic)), pair_bits(__hadd2(a, magic_plus_two)),
                                         pair_bits(__hfma2(a, half, magic_plus_four)));
  return __vminu2(n, kSaturated) | ((sign_word >> 12) & 0x00080008u);  // sign bits 15, 31 → bits 3, 19
}

// The code bits of the pair w (two inputs of type T) scaled by `scale`.
template <class T>
__device__ __forceinline__ std::uint32_t mx_code_bits_x2(std::uint32_t w, typename Pairs<T>::H2 scale) {
  using H2 = typename Pairs<T>::H2;
  return e2m1_code_bits_x2<T>(__hmul2(as_pair<H2>(w & 0x7FFF7FFFu), scale), w);
}

// Eight codes, element e at nibble e, from bits_of_pair(j), the code bits of
// the pair (element j, element j + 4): the two codes of pair j land in
// nibbles j and j + 4 by a shift of 4j. The constant bits(M) of every half is
// added along and subtracted once: the sum of the shifted words is linear
// modulo 2^32, and the codes' nibbles do not overlap.
template <class T, class F>
__device__ __forceinline__ std::uint32_t pack_codes_x8(F bits_of_pair) {
  constexpr std::uint32_t kMagicSum = Pairs<T>::kMagicBitsPair * 0x1111u;  // Σ_j bits(M) pair · 16^j, mod 2^32
  std::uint32_t acc = bits_of_pair(3);
  acc = acc * 16u + bits_of_pair(2);
  acc = acc * 16u + bits_of_pair(1);
  acc = acc * 16u + bits_of_pair(0);
  return acc - kMagicSum;
}

// Eight codes from p[j] = (element j, element j + 4), each scaled by `scale`.
template <class T>
__device__ __forceinline__ std::uint32_t mx_codes_x8(const std::uint32_t* p, typename Pairs<T>::H2 scale) {
  return pack_codes_x8<T>([&](int j) { return mx_code_bits_x2<T>(p[j], scale); });
}

// The same eight codes one at a time in fp32 (fp4_codes.cuh), for blocks
// whose scale mx_pairs_apply rejects.
template <class T>
__device__ __forceinline__ std::uint32_t mx_codes_x8_fp32(const std::uint32_t* p, std::uint32_t scale_code) {
  const float inv = exp2i(kE8M0Bias - static_cast<int>(scale_code));  // 2^-k: the product is exact
  std::uint32_t word = 0;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const float lo = __uint_as_float(Pairs<T>::float_bits(p[j] & 0xFFFFu));
    const float hi = __uint_as_float(Pairs<T>::float_bits(p[j] >> 16));
    word |= e2m1_code(__fmul_rn(lo, inv)) << (4 * j) | e2m1_code(__fmul_rn(hi, inv)) << (4 * (j + 4));
  }
  return word;
}

// Two fp32 values y as f16x2 (lo in the low half) rounded to odd: toward
// zero, then the last mantissa bit set wherever that dropped a nonzero bit;
// the value is truncated | sticky. For fp32 results that the packed encoder
// then codes without a scale. Why that equals encode_rne_sat(e2m1, y) for
// |y| < 256: every point where a piece of e2m1_code_bits_x2 changes its
// rounded value is a multiple of 1/4 below 256, at most 10 significant bits,
// so it is an f16 whose last mantissa bit is 0. The rounded value is on the
// same side of each such point as y and equals it only when y does (a value
// rounded down onto the point had dropped bits, and its set last bit moves
// it above; one just below the point is odd already). Below f16's normal
// range (|y| < 2^-14) the sticky test can miss dropped bits, but such y are
// far under 0.25 and get code 0 either way.
struct RoundedToOdd {
  std::uint32_t truncated;  // f16x2 toward zero, signs included
  std::uint32_t sticky;     // 1 in bit 0 / 16 where that half dropped a nonzero bit
};
__device__ __forceinline__ RoundedToOdd f16x2_round_to_odd(float lo, float hi) {
  RoundedToOdd r;
  asm("cvt.rz.f16x2.f32 %0, %1, %2;" : "=r"(r.truncated) : "f"(hi), "f"(lo));  // first source → high half
  constexpr std::uint32_t kDropped = (1u << 13) - 1u;  // fp32 mantissa bits below f16's (normal range)
  // The low 16 bits of both floats side by side (lo's in the low half), cut
  // to the dropped bits; min(·, 1) per 16-bit half is then the sticky bit.
  const std::uint32_t d =
      __byte_perm(__float_as_uint(lo), __float_as_uint(hi), 0x5410) & (kDropped | kDropped << 16);
  r.sticky = __vminu2(d, 0x00010001u);
  return r;
}

// Eight codes (element e at nibble e) of the fp32 values y(0 .. 7), |y| < 256:
// f16 pairs (y(j), y(j + 4)) rounded to odd, coded without a scale, equal to
// encode_rne_sat(e2m1, y) (f16x2_round_to_odd says why). The magnitude is
// (truncated | sticky) without the signs, one three-input logic op; the signs
// are the truncated pair's. For the quantizer's fp32 paths (NVFP4 quotients,
// smooth_k differences times 2^-k).
template <class Y>
__device__ __forceinline__ std::uint32_t e2m1_codes_x8_fp32(Y y) {
  return pack_codes_x8<__half>([&](int j) {
    const RoundedToOdd r = f16x2_round_to_odd(y(j), y(j + 4));
    return e2m1_code_bits_x2<__half>(as_pair<__half2>((r.truncated | r.sticky) & 0x7FFF7FFFu), r.truncated);
  });
}

// The pairs mx_codes_x8 takes, from words w[0..3] holding elements (0, 1),
// (2, 3), (4, 5), (6, 7) as a segment does.
__device__ __forceinline__ void segment_pairs(const std::uint32_t (&w)[4], std::uint32_t (&p)[4]) {
  constexpr std::uint32_t kLowHalves = 0x5410, kHighHalves = 0x7632;  // __byte_perm selectors
  p[0] = __byte_perm(w[0], w[2], kLowHalves), p[1] = __byte_perm(w[0], w[2], kHighHalves);
  p[2] = __byte_perm(w[1], w[3], kLowHalves), p[3] = __byte_perm(w[1], w[3], kHighHalves);
}

// Float bits of the largest 16-bit magnitude in words[0 .. n).
template <class T, int N>
__device__ __forceinline__ std::uint32_t pairs_amax_bits(const std::uint32_t (&words)[N]) {
  std::uint32_t m = 0;
#pragma unroll
  for (int i = 0; i < N; ++i) m = pair_magnitude_max(m, words[i]);
  return Pairs<T>::float_bits(max(m & 0xFFFFu, m >> 16));
}

}  // namespace fp4attn::cuda_quantize::fp4
