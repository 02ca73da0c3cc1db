// S = Q·Kᵀ for one query row against one key tile, with the operands
// (operands.hpp) and the accumulation of the tensor core: fp32 in order, or
// the sm90 FP8 wgmma model (tensor_core.hpp). Shared by the forward pass and
// by the backward's recomputation of P.
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
  std::vector<float> exponents;      // (D, block_k) e4m3_exponent of values, for the FP8 wgmma model
  std::vector<float> partial;        // (block_k) scratch: one block's partial sums
  std::vector<float> q_exponents;    // (D) scratch: the query row's e4m3 exponents
  std::vector<float> mma_scratch;    // (2 · block_k) scratch of fp8_mma_step

  KeyTile(std::int64_t D, std::int64_t block_k_)
      : block_k(block_k_),
        values(static_cast<std::size_t>(D * block_k_)),
        block_factor(static_cast<std::size_t>(D * block_k_)),
        row_factor(static_cast<std::size_t>(block_k_)),
        exponents(static_cast<std::size_t>(D * block_k_)),
        partial(static_cast<std::size_t>(block_k_)),
        q_exponents(static_cast<std::size_t>(D)),
        mma_scratch(static_cast<std::size_t>(2 * block_k_)) {}
};

// Loads keys [j0, j0 + kn) of kv head h.
void load_key_tile(const QkOperand& k, std::int64_t b, std::int64_t h, std::int64_t j0, std::int64_t kn, KeyTile& t);

// s[j] for j < kn and the factor f that makes s·f the score:
//  * fp32 accumulation: s = Σ_blocks (Σ_d q·k)·(block factors)·(row factor · key factor), f = 1;
//  * FP8 wgmma model (`fp8_mma`): s = the accumulator of the D/32 chained k32
//    steps the kernel holds, f = row factor · key factor (one per tile), which
//    the kernel folds into its softmax multiplier instead of rounding s·f.
float score_row(const QkOperand& q, std::int64_t b, std::int64_t h, std::int64_t i, KeyTile& keys, bool fp8_mma,
                float* s);

// smooth_k shifts every score of query row i by −scale·q_deq·k̄ (q_deq: the
// quantized Q the kernel multiplies); this is that shift, 0 without smooth_k.
// The forward adds it to the LSE so LSE stays the LSE of the original scores;
// the backward subtracts it again to recompute P from the smoothed scores.
float smooth_k_shift(const QuantizedInputs& in, const AttentionShape& shape, float scale, std::int64_t b,
                     std::int64_t hq, std::int64_t i);

}  // namespace fp4attn::emulator
