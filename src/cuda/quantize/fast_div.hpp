// Division of 31-bit unsigned integers by a divisor fixed at launch, as a
// multiply-high, an add and a shift (Granlund and Montgomery's round-up
// method): the quantizer decodes each CTA's block index into (b, h, block)
// with it, where the compiler's generic 32-bit division took about twenty
// instructions a quotient. Host and device code; tests/test_fast_div.cpp
// checks it against `/` on the CPU.
#pragma once

#include <cstdint>

#ifdef __CUDACC__
#define FP4ATTN_HOST_DEVICE __host__ __device__
#else
#define FP4ATTN_HOST_DEVICE
#endif

namespace fp4attn::cuda_quantize {

struct FastDiv {
  std::uint32_t d = 1;
  std::uint32_t magic = 1;  // ⌊2^32 (2^shift − d) / d⌋ + 1
  std::uint32_t shift = 0;  // ⌈log2 d⌉

  FastDiv() = default;
  // d in [1, 2^31).
  explicit FastDiv(std::uint32_t divisor) : d(divisor) {
    while ((std::uint64_t{1} << shift) < d) ++shift;
    magic = static_cast<std::uint32_t>((std::uint64_t{1} << 32) * ((std::uint64_t{1} << shift) - d) / d + 1);
  }

  // n / d for n in [0, 2^31): t + n stays below 2^32.
  FP4ATTN_HOST_DEVICE std::uint32_t quotient(std::uint32_t n) const {
#ifdef __CUDA_ARCH__
    const std::uint32_t t = __umulhi(n, magic);
#else
    const auto t = static_cast<std::uint32_t>((static_cast<std::uint64_t>(n) * magic) >> 32);
#endif
    return (t + n) >> shift;
  }
  FP4ATTN_HOST_DEVICE std::uint32_t remainder(std::uint32_t n, std::uint32_t q) const { return n - q * d; }
};

}  // namespace fp4attn::cuda_quantize

#undef FP4ATTN_HOST_DEVICE
