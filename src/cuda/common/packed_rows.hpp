// The tile-aligned layout of packed sequences (cu_seqlens): every per-token
// buffer the quantizer writes and the kernels read (codes, their transposed
// copies, block scales, row statistics, the one pass's dQ sums) holds one
// batch of `packed_layout_rows` token rows, and sequence b starts at row
// rows[b] = 128·Σ_{i<b} ⌈len_i / 128⌉. Each sequence's 128-token tiles are
// then tiles of that batch, no tile spans two sequences, and the buffers grow
// with the tokens in all (at most 127 rows of padding per sequence) instead
// of with the number of sequences times the longest.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace fp4attn::cuda_common {

inline constexpr int kPackedRowAlign = 128;  // the quantizer's token block and the kernels' tile

// Rows of the layout for `tokens` tokens in `sequences` sequences: an upper
// bound of Σ 128·⌈len_i / 128⌉ that the host knows without reading cu_seqlens
// (Σ ⌈len_i / 128⌉ ≤ ⌈(tokens + 127·sequences) / 128⌉).
constexpr std::int64_t packed_layout_rows(std::int64_t tokens, std::int64_t sequences) {
  return (tokens + (kPackedRowAlign - 1) * sequences + kPackedRowAlign - 1) / kPackedRowAlign * kPackedRowAlign;
}

// rows[b] for b = 0 .. B (rows[B]: the rows the sequences take) from the B + 1
// device ints of cu_seqlens, into B + 1 device ints; on `stream`, one CTA.
void fill_packed_rows(const int* cu_seqlens, int B, int* rows, cudaStream_t stream);

}  // namespace fp4attn::cuda_common
