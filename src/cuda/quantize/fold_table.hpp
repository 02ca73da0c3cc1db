// The E4M3 bytes that the E2M1 magnitudes of one MX block fold to (DESIGN
// §3.4): q·2^(E − R + 6) for the block exponent E within a group of exponent
// R, rounded as the emulator's fold_mx_to_e4m3. Host and device, so the CPU
// tests check the table the fold kernels use; fold_word, which applies it to
// eight codes, is shared by the fold pre-pass (fold_mx.cu) and the forward
// kernel's in-kernel expansion (sm90/fwd/fp8_direct_p/fp4_expand.cuh).
#pragma once

#include <cstdint>

#include "fp4attn/formats.hpp"

#if defined(__CUDACC__)
#include <cuda_fp8.h>
#endif

namespace fp4attn::cuda_quantize {

inline constexpr int kFoldHeadroom = 6;  // R maps to 2^6: 6 · 2^6 = 384 ≤ 448 (emulator::kSm90FoldHeadroom)

// Magnitude i (0 .. 7) in byte i: 0 .. 3 in lo, 4 .. 7 in hi.
struct FoldTable {
  std::uint32_t lo, hi;
};

// E4M3 byte of E2M1 magnitude q (0 .. 7) in a block of exponent e folded into a group of exponent r.
FP4ATTN_HD inline std::uint32_t fold_magnitude(std::uint32_t q, int e, int r) {
  return encode_rne_sat(ElemFormat::e4m3, decode(ElemFormat::e2m1, q) * exp2i(e - r + kFoldHeadroom));
}

// A block more than 11 binades below r: E4M3 subnormals and zeros, rounded
// to nearest even. The host converts magnitude by magnitude; the device lets
// cvt.rn.satfinite.e4m3x2 round q·2^k (exact in fp32, or far below E4M3's
// smallest subnormal where fp32 flushes it): four conversions instead of a
// loop of encodes, which kept the forward kernel's expanding producer within
// its 40 registers. A GPU test compares both for every pair of E8M0 exponents.
FP4ATTN_HD inline FoldTable fold_table_exact(int e, int r) {
  FoldTable t{0, 0};
#if defined(__CUDA_ARCH__)
  const float s = exp2i(e - r + kFoldHeadroom);
  const auto pair = [](float a, float b) {
    return static_cast<std::uint32_t>(__nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE, __NV_E4M3));
  };
  t.lo = pair(0.0f, 0.5f * s) | pair(s, 1.5f * s) << 16;
  t.hi = pair(2.0f * s, 3.0f * s) | pair(4.0f * s, 6.0f * s) << 16;
#else
  for (int i = 0; i < 4; ++i) {
    t.lo |= fold_magnitude(static_cast<std::uint32_t>(i), e, r) << (8 * i);
    t.hi |= fold_magnitude(static_cast<std::uint32_t>(4 + i), e, r) << (8 * i);
  }
#endif
  return t;
}

// For k = e − r + 6 ≥ −5 every nonzero value q·2^k is an E4M3 normal, whose
// byte is the byte of q plus k in the exponent field: one add on four bytes
// at once (no byte leaves [0x08, 0x7C], so none borrows or carries into its
// neighbour). Blocks further below r take fold_table_exact.
FP4ATTN_HD inline FoldTable fold_table(int e, int r) {
  constexpr std::uint32_t kE4m3OfE2m1Lo = 0x3C383000u;  // 1.5, 1, 0.5, 0
  constexpr std::uint32_t kE4m3OfE2m1Hi = 0x4C484440u;  // 6, 4, 3, 2
  constexpr int kMinFastShift = -5;
  const int k = e - r + kFoldHeadroom;
  if (k >= kMinFastShift) {
    const std::uint32_t step = static_cast<std::uint32_t>(k) * 0x08u;  // k in the exponent field (bits 3 .. 6)
    return {kE4m3OfE2m1Lo + (step << 8) * 0x010101u, kE4m3OfE2m1Hi + step * 0x01010101u};
  }
  return fold_table_exact(e, r);
}

#if defined(__CUDACC__)
// prmt.b32 in its default mode, where a selector nibble with bit 3 set
// replicates bit 7 of the byte it picks instead of copying the byte (PTX ISA,
// prmt). __byte_perm documents only the low three selector bits, so the mode
// is asked for explicitly.
__device__ __forceinline__ std::uint32_t prmt(std::uint32_t a, std::uint32_t b, std::uint32_t selector) {
  std::uint32_t r;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(selector));
  return r;
}

// Eight E4M3 bytes of the eight nibbles of `codes` (element 2i in the low
// nibble of byte i; nibble i becomes byte i of lo, then of hi) by table: a
// byte permute picks each magnitude's byte from the block's fold_table. The
// signs come from a second permute over 0x80 bytes with the raw nibbles as
// selectors: a positive nibble copies 0x80, a negative one replicates its
// bit 7 into 0xFF, so bit 6 of each byte is the sign; shifted to bit 7 it is
// OR-ed in (E4M3 magnitudes never use bit 7). Eleven instructions per word.
__device__ __forceinline__ uint2 fold_word(std::uint32_t codes, FoldTable table) {
  constexpr std::uint32_t kSignProbe = 0x80808080u, kSignBits = 0x80808080u;
  const std::uint32_t mag = codes & 0x77777777u;  // selectors 0 .. 7: plain byte picks
  const std::uint32_t lo = prmt(table.lo, table.hi, mag);
  const std::uint32_t hi = prmt(table.lo, table.hi, mag >> 16);
  const std::uint32_t sign_lo = prmt(kSignProbe, kSignProbe, codes);
  const std::uint32_t sign_hi = prmt(kSignProbe, kSignProbe, codes >> 16);
  return make_uint2(lo | ((sign_lo << 1) & kSignBits), hi | ((sign_hi << 1) & kSignBits));
}
#endif

}  // namespace fp4attn::cuda_quantize
