// Operands of the two attention products as the tensor cores see them.
//
// A quantized tensor is a grid of codes with scales; what an MMA instruction
// multiplies is narrower: per-element values it can represent exactly, an
// optional factor per block of the reduction dimension (block-scaled FP4 on
// sm100), and factors applied to the fp32 accumulator afterwards (FP8 tensor
// scales, the sm90 per-row power of two of §3.4, NVFP4's tensor scale). The
// forward and backward passes only ever see these views, so each product is
// written once for every recipe and target.
#pragma once

#include <cstdint>
#include <vector>

#include "fp4attn/formats.hpp"
#include "fp4attn/quantize.hpp"
#include "fp4attn/recipe.hpp"

namespace fp4attn::emulator {

// E2M1 · 2^k is an E4M3 value exactly for k in [-8, 6] (DESIGN §3.4). Folding a
// row of MX blocks into E4M3 bytes gives the largest block exponent R the
// shift k = 6 (6 · 2^6 = 384 ≤ 448), so every block with E ≥ R − 14 lands
// exactly and the row keeps the factor 2^(R − 6) outside the product.
inline constexpr int kSm90FoldHeadroom = 6;

// Value of the E4M3 byte an E2M1 value q of block exponent E becomes in a row
// whose largest block exponent is R. Out of the window it is rounded to an
// E4M3 subnormal or zero: the loss sm90 really has.
inline float fold_mx_to_e4m3(float q, int block_exp, int row_exp) {
  return round_to(ElemFormat::e4m3, q * exp2i(block_exp - row_exp + kSm90FoldHeadroom));
}
inline float sm90_fold_factor(int row_exp) { return exp2i(row_exp - kSm90FoldHeadroom); }
// The R that FP4 P (recipe mxfp4) folds against on sm90: the ceiling of every
// block exponent (p_row.cpp), so the fold needs no per-tile maximum.
inline constexpr int kSm90PRowExponent = -2;

// Block exponent of an MXFP4 scale code.
inline int mx_exponent(std::uint8_t scale_code) { return static_cast<int>(scale_code) - kE8M0Bias; }

// Q or K for S = Q·Kᵀ: rows of D values along the reduction dimension.
//   S[i][j] = (Σ_blocks (Σ_d q[i][d]·k[j][d]) · qb[i][blk]·kb[j][blk]) · (qr[i]·kr[j])
struct QkOperand {
  std::int64_t B = 0, H = 0, S = 0, D = 0;
  std::int64_t block = 0;           // reduction elements per block factor (= D when there is no inner scale)
  std::vector<float> values;        // (B, H, S, D): head-major so a head's rows are contiguous
  std::vector<float> block_factor;  // (B, H, S, D / block)
  std::vector<float> row_factor;    // (B, H, S)

  std::int64_t blocks() const { return D / block; }
  std::int64_t row(std::int64_t b, std::int64_t h, std::int64_t s) const { return (b * H + h) * S + s; }
  const float* values_of(std::int64_t b, std::int64_t h, std::int64_t s) const { return &values[row(b, h, s) * D]; }
  const float* block_factors_of(std::int64_t b, std::int64_t h, std::int64_t s) const {
    return &block_factor[row(b, h, s) * blocks()];
  }
};

// `fold_rows` is how many consecutive rows share one sm90 power of two: 1 for
// Q (a per-row factor), block_k for K (one scalar per key tile). Unused by
// every other recipe/target pair.
QkOperand qk_operand(const QuantizedTensor& t, Target target, std::int64_t fold_rows);

// V for O = P·V: rows are tokens (the reduction dimension), columns channels.
//   O[i][d] = (Σ_blocks (Σ_j p[i][j]·v[j][d]) · pb[i][blk]·vb[blk][d]) · pr[i], then · vc[d] at the end
struct VOperand {
  std::int64_t B = 0, H = 0, S = 0, D = 0;
  std::int64_t block = 0;           // tokens per block factor; 0 when V has no inner block scale
  std::vector<float> values;        // (B, H, S, D)
  std::vector<float> block_factor;  // (B, H, ceil(S / block), D) when block > 0
  std::vector<float> col_factor;    // (B, H, D), applied in the epilogue

  std::int64_t head(std::int64_t b, std::int64_t h) const { return b * H + h; }
  const float* values_of(std::int64_t b, std::int64_t h, std::int64_t s) const {
    return &values[(head(b, h) * S + s) * D];
  }
};

VOperand v_operand(const QuantizedTensor& t, Target target);

}  // namespace fp4attn::emulator
