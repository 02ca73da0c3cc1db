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

#include <array>
#include <cstdint>

namespace fp4attn::cuda_common {

inline constexpr int kPackedRowAlign = 128;  // the quantizer's token block and the kernels' tile

// Rows of the layout for `tokens` tokens in `sequences` sequences: an upper
// bound of Σ 128·⌈len_i / 128⌉ that the host knows without reading cu_seqlens
// (Σ ⌈len_i / 128⌉ ≤ ⌈(tokens + 127·sequences) / 128⌉).
constexpr std::int64_t packed_layout_rows(std::int64_t tokens, std::int64_t sequences) {
  return (tokens + (kPackedRowAlign - 1) * sequences + kPackedRowAlign - 1) / kPackedRowAlign * kPackedRowAlign;
}

// What a packed call was sized for without reading its cu_seqlens: B
// sequences, total_q and total_k tokens (the packed tensors' rows), grids for
// sequences of at most max_q queries and max_k keys.
struct PackedBounds {
  int B = 0;
  std::int64_t total_q = 0, total_k = 0, max_q = 0, max_k = 0;
};

// A device tensor of rows × heads × cols elements (cols contiguous, strides
// in elements) that a call with invalid cu_seqlens fills with NaN.
struct NanFill {
  enum class Type : std::uint8_t { f32, f16, bf16 };
  void* data = nullptr;  // null: nothing to fill
  Type type = Type::bf16;
  std::int64_t rows = 0, heads = 0, cols = 0, stride_row = 0, stride_head = 0;
};

// Device ints a packed call works from, 4·(B + 1) of them: cu_q and cu_k as
// checked, then rows_q and rows_k (rows[b] for b = 0 .. B, rows[B] the rows
// the sequences take).
inline constexpr std::int64_t packed_sequence_ints(std::int64_t B) { return 4 * (B + 1); }
struct PackedSequences {
  const int* cu_q;
  const int* cu_k;
  const int* rows_q;
  const int* rows_k;
};
inline PackedSequences packed_sequences(const int* ints, int B) {
  return {ints, ints + (B + 1), ints + 2 * (B + 1), ints + 3 * (B + 1)};
}

// Checks the caller's cu_seqlens on the device, where the host cannot read
// them without waiting (and a CUDA graph replays a call with whatever they
// hold then): both start at 0, never decrease, end at total_q / total_k, and
// no sequence is longer than max_q / max_k. Valid: `ints` gets copies of them
// and the sequences' first rows in the tile-aligned layout. Invalid: every
// sequence is empty there (so that no kernel reading them touches a row) and
// the `fills` become NaN, the outputs' answer to input they cannot use, as
// for non-finite values. One CTA on `stream`; B is at most 65535.
void check_packed_sequences(const int* cu_seqlens_q, const int* cu_seqlens_k, const PackedBounds& bounds, int* ints,
                            const std::array<NanFill, 3>& fills, cudaStream_t stream);

}  // namespace fp4attn::cuda_common
