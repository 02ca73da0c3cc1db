// S = Q·Kᵀ for one query row against one key tile, with the operands and the
// fp32 accumulation order of the tensor core (operands.hpp). Shared by the
// forward pass and by the backward's recomputation of P.
#pragma once

#include <cstdint>
#include <vector>

#include "emulator/operands.hpp"
#include "fp4attn/emulator.hpp"

namespace fp4attn::emulator {

// A key tile in the transposed layout (D, block_k), so that the inner loop of
// a row's scores runs over contiguous keys: each score is still summed over d
// in ascending order, only many of them at once.
struct KeyTile {
  std::int64_t block_k = 0, kn = 0;  // tile width and keys actually present
  std::vector<float> values;         // (D, block_k)
  std::vector<float> block_factor;   // (D / block, block_k)
  std::vector<float> row_factor;     // (block_k)
  std::vector<float> partial;        // (block_k) scratch: one block's partial sums

  KeyTile(std::int64_t D, std::int64_t block_k_)
      : block_k(block_k_),
        values(static_cast<std::size_t>(D * block_k_)),
        block_factor(static_cast<std::size_t>(D * block_k_)),
        row_factor(static_cast<std::size_t>(block_k_)),
        partial(static_cast<std::size_t>(block_k_)) {}
};

// Loads keys [j0, j0 + kn) of kv head h.
void load_key_tile(const QkOperand& k, std::int64_t b, std::int64_t h, std::int64_t j0, std::int64_t kn, KeyTile& t);

// s[j] for j < kn: Σ_blocks (Σ_d q·k) · (block factors), then · (row factor · key factor).
void score_row(const QkOperand& q, std::int64_t b, std::int64_t h, std::int64_t i, KeyTile& keys, float* s);

// smooth_k shifts every score of query row i by −scale·q_deq·k̄ (q_deq: the
// quantized Q the kernel multiplies); this is that shift, 0 without smooth_k.
// The forward adds it to the LSE so LSE stays the LSE of the original scores;
// the backward subtracts it again to recompute P from the smoothed scores.
float smooth_k_shift(const QuantizedInputs& in, const AttentionShape& shape, float scale, std::int64_t b,
                     std::int64_t hq, std::int64_t i);

}  // namespace fp4attn::emulator
