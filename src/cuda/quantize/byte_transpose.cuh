// The 4 × 4 transpose of the bytes of four words, by six byte permutes: how
// the quantizer and the MX fold turn four tokens' words of four channels into
// four channels' words of four tokens (the transposed operand copies).
#pragma once

#include <cstdint>

namespace fp4attn::cuda_quantize {

// Byte i of out[c] is byte c of in[i].
__device__ __forceinline__ void transpose_bytes_4x4(const std::uint32_t (&in)[4], std::uint32_t (&out)[4]) {
  const std::uint32_t lo01 = __byte_perm(in[0], in[1], 0x5140), hi01 = __byte_perm(in[0], in[1], 0x7362);
  const std::uint32_t lo23 = __byte_perm(in[2], in[3], 0x5140), hi23 = __byte_perm(in[2], in[3], 0x7362);
  out[0] = __byte_perm(lo01, lo23, 0x5410);
  out[1] = __byte_perm(lo01, lo23, 0x7632);
  out[2] = __byte_perm(hi01, hi23, 0x5410);
  out[3] = __byte_perm(hi01, hi23, 0x7632);
}

}  // namespace fp4attn::cuda_quantize
