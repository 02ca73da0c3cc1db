// Writes a 128-token tile of E4M3 codes, held in shared memory as token rows
// of D bytes, in the transposed layout the FP8 backward reads: D rows of 128
// codes, each 32-token group in the A-operand order (slot k holds token
// vt_key_of_slot(k)). A thread takes four channels of one 32-token group: per
// four slots it reads the four tokens' words of those channels and
// transposes the 4 × 4 bytes by byte permutes, then stores 32 bytes (a whole
// sector) per channel. At D = 128 a warp reads one token row per
// instruction, free of bank conflicts. The MX fold writes recipe
// mxfp4_train's Qᵀ and Kᵀ this way from its own tile; the FP8 quantizer,
// which holds four tokens' words per thread, permutes in registers instead.
#pragma once

#include <cstdint>

#include "cuda/quantize/byte_transpose.cuh"
#include "cuda/quantize/quantize_fp8.hpp"  // kVtKeyGroup, vt_key_of_slot

namespace fp4attn::cuda_quantize {

inline constexpr int kTransposedTileTokens = 128;

// Threads that store a tile at head dim D: one per (channel quad, group).
template <int D>
inline constexpr int kTransposeStoreThreads = D / 4 * (kTransposedTileTokens / kVtKeyGroup);

// `tile`: 128 rows of D codes (rows past the tensor's end hold zeros).
// `dst`: channel 0's first token of the tile; channel rows `pitch` bytes
// apart, 16-byte aligned. Threads at or above kTransposeStoreThreads<D>
// return at once.
template <int D>
__device__ __forceinline__ void store_tile_transposed(const std::uint8_t* tile, std::uint8_t* dst, std::int64_t pitch,
                                                      int thread) {
  constexpr int kQuads = D / 4;  // four channels per thread
  if (thread >= kTransposeStoreThreads<D>) return;
  const int quad = thread % kQuads, group = thread / kQuads;
  const std::uint8_t* column = tile + group * kVtKeyGroup * D + 4 * quad;
  std::uint32_t rows[4][kVtKeyGroup / 4];  // channel 4·quad + c, slots 4m .. 4m + 3 in word m
#pragma unroll
  for (int m = 0; m < kVtKeyGroup / 4; ++m) {
    std::uint32_t w[4];  // token of slot 4m + i: its four channels
#pragma unroll
    for (int i = 0; i < 4; ++i) w[i] = *reinterpret_cast<const std::uint32_t*>(column + vt_key_of_slot(4 * m + i) * D);
    std::uint32_t c[4];
    transpose_bytes_4x4(w, c);
#pragma unroll
    for (int k = 0; k < 4; ++k) rows[k][m] = c[k];
  }
  std::uint8_t* out = dst + 4 * quad * pitch + group * kVtKeyGroup;
#pragma unroll
  for (int c = 0; c < 4; ++c) {
    auto* row = reinterpret_cast<uint4*>(out + c * pitch);
    row[0] = make_uint4(rows[c][0], rows[c][1], rows[c][2], rows[c][3]);
    row[1] = make_uint4(rows[c][4], rows[c][5], rows[c][6], rows[c][7]);
  }
}

}  // namespace fp4attn::cuda_quantize
