// MXFP4 codes of bf16 / fp16 inputs two at a time, in the inputs' own
// packed arithmetic (bf16x2, f16x2), equal to fp4attn::encode_rne_sat(e2m1,
// x · 2^-k) of the CPU quantizer.
//
// Why it is exact. x · 2^-k is exact in the input's format whenever 2^-k is a
// normal number of it (mx_pairs_apply says when): a bf16 / fp16 times a power
// of two needs no rounding, except below the normal range, where every value
// is far under 0.25, E2M1's first rounding boundary, and gets code 0 however
// it rounds. For a = |x · 2^-k| the E2M1 magnitude code is
//   n0 + n1 + n2,  n0 = rint(2 · min(a, 2)),  n1 = rint(clamp(a, 2, 4) − 2),
//                  n2 = rint((clamp(a, 4, 6) − 4) / 2)
// (rint ties to even: the grid is 0.5 below 2, 1 up to 4, 2 up to 6, and a
// tie of one piece is a tie of E2M1). Each rint is one fused operation with
// an exactly representable addend M (128 for bf16, 1024 for fp16, whose ulp
// is 1): the sum is rounded once, and its bits are those of M plus the
// integer. clamp(a, 2, 4) − 2 and the like are exact, so M − 2 absorbs them.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "fp4attn/formats.hpp"

namespace fp4attn::cuda_quantize::fp4 {

template <class T>
struct Pairs;

template <>
struct Pairs<__nv_bfloat16> {
  using H2 = __nv_bfloat162;
  static constexpr float kRintMagic = 128.0f;  // ulp 1 in [128, 256)
  static constexpr int kMantissaBits = 7;
  // E8M0 codes whose 2^-k is a normal bf16 and whose blocks hold no value
  // that a flush of bf16 subnormals could move off code 0 (k ≥ −123).
  static constexpr std::uint32_t kMinScaleCode = 4, kMaxScaleCode = 253;
  __device__ static H2 splat(float f) { return __float2bfloat162_rn(f); }
  // Float bits of a 16-bit magnitude pattern.
  __device__ static std::uint32_t float_bits(std::uint32_t m) { return m << 16; }
};

template <>
struct Pairs<__half> {
  using H2 = __half2;
  static constexpr float kRintMagic = 1024.0f;  // ulp 1 in [1024, 2048)
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

// E2M1 codes (sign included) of the two halves of w times `scale`: the low
// half's code in bits 0-3, the high half's in bits 16-19.
template <class T>
__device__ __forceinline__ std::uint32_t mx_codes_x2(std::uint32_t w, typename Pairs<T>::H2 scale) {
  using P = Pairs<T>;
  using H2 = typename P::H2;
  const H2 two = P::splat(2.0f), four = P::splat(4.0f), six = P::splat(6.0f), half = P::splat(0.5f);
  const H2 magic = P::splat(P::kRintMagic), magic_less_two = P::splat(P::kRintMagic - 2.0f);
  const H2 a = __habs2(__hmul2(as_pair<H2>(w), scale));
  const H2 r0 = __hfma2(__hmin2(a, two), two, magic);
  const H2 r1 = __hadd2(__hmin2(__hmax2(a, two), four), magic_less_two);
  const H2 r2 = __hfma2(__hmin2(__hmax2(a, four), six), half, magic_less_two);
  constexpr std::uint32_t kLowNibbles = 0x000F000Fu;  // n < 8 sits in the low bits of M + n
  const std::uint32_t magnitude =
      (pair_bits(r0) & kLowNibbles) + (pair_bits(r1) & kLowNibbles) + (pair_bits(r2) & kLowNibbles);
  return magnitude | ((w >> 12) & 0x00080008u);  // the inputs' sign bits 15, 31 → code bits 3, 19
}

// Eight codes, element e at nibble e, from p[j] = (element j, element j + 4):
// the two codes of pair j land in nibbles j and j + 4 by one shift.
template <class T>
__device__ __forceinline__ std::uint32_t mx_codes_x8(const std::uint32_t* p, typename Pairs<T>::H2 scale) {
  return mx_codes_x2<T>(p[0], scale) | mx_codes_x2<T>(p[1], scale) << 4 | mx_codes_x2<T>(p[2], scale) << 8 |
         mx_codes_x2<T>(p[3], scale) << 12;
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
