// The E4M3 bytes that the E2M1 magnitudes of one MX block fold to (DESIGN
// §3.4): q·2^(E − R + 6) for the block exponent E within a group of exponent
// R, rounded as the emulator's fold_mx_to_e4m3. Host and device, so the CPU
// tests check the table the fold kernels use.
#pragma once

#include <cstdint>

#include "fp4attn/formats.hpp"

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

// For k = e − r + 6 ≥ −5 every nonzero value q·2^k is an E4M3 normal, whose
// byte is the byte of q plus k in the exponent field: one add on four bytes
// at once (no byte leaves [0x08, 0x7C], so none borrows or carries into its
// neighbour). Blocks further below r take the exact conversion per magnitude.
FP4ATTN_HD inline FoldTable fold_table(int e, int r) {
  constexpr std::uint32_t kE4m3OfE2m1Lo = 0x3C383000u;  // 1.5, 1, 0.5, 0
  constexpr std::uint32_t kE4m3OfE2m1Hi = 0x4C484440u;  // 6, 4, 3, 2
  constexpr int kMinFastShift = -5;
  const int k = e - r + kFoldHeadroom;
  if (k >= kMinFastShift) {
    const std::uint32_t step = static_cast<std::uint32_t>(k) * 0x08u;  // k in the exponent field (bits 3 .. 6)
    return {kE4m3OfE2m1Lo + (step << 8) * 0x010101u, kE4m3OfE2m1Hi + step * 0x01010101u};
  }
  FoldTable t{0, 0};
#if defined(__CUDACC__)
#pragma unroll
#endif
  for (int i = 0; i < 4; ++i) {
    t.lo |= fold_magnitude(static_cast<std::uint32_t>(i), e, r) << (8 * i);
    t.hi |= fold_magnitude(static_cast<std::uint32_t>(4 + i), e, r) << (8 * i);
  }
  return t;
}

}  // namespace fp4attn::cuda_quantize
