#include "emulator/operands.hpp"

#include <algorithm>

#include "emulator/numerics.hpp"
#include "fp4attn/direct_p.hpp"
#include "fp4attn/error.hpp"
#include "fp4attn/tensor.hpp"

namespace fp4attn::emulator {
namespace {

std::uint8_t code_at(const QuantizedTensor& t, std::int64_t b, std::int64_t s, std::int64_t h, std::int64_t d) {
  return t.codes[bshd_index(t.S, t.H, t.D, b, s, h, d)];
}

// NVFP4 element times its UE4M3 block scale: at most 2 × 4 significant bits, so
// exactly a BF16 value (DESIGN §3.4) and exact in fp32; only the fp32 tensor
// scale stays outside the product.
float nvfp4_scaled_value(const QuantizedTensor& t, std::int64_t b, std::int64_t s, std::int64_t h, std::int64_t d) {
  return decode(ElemFormat::e2m1, code_at(t, b, s, h, d)) * t.scales[t.scale_index(b, s, h, d)];
}

void qk_fp8(const QuantizedTensor& t, QkOperand& op) {
  for (std::int64_t b = 0; b < t.B; ++b)
    for (std::int64_t h = 0; h < t.H; ++h)
      for (std::int64_t s = 0; s < t.S; ++s) {
        const std::int64_t r = op.row(b, h, s);
        // E4M3 × E4M3 products are exact in fp32; the per-token-block scale
        // multiplies the accumulator.
        op.row_factor[r] = t.scales[t.scale_index(b, s, h, 0)];
        for (std::int64_t d = 0; d < t.D; ++d) op.values[r * t.D + d] = decode(ElemFormat::e4m3, code_at(t, b, s, h, d));
      }
}

void qk_mx_sm100(const QuantizedTensor& t, QkOperand& op) {
  // Block-scaled MMA: E2M1 products summed per 32-block, then 2^(Eq + Ek).
  op.block = kMxfp4Block;
  op.block_factor.assign(static_cast<std::size_t>(op.B * op.H * op.S * op.blocks()), 1.0f);
  for (std::int64_t b = 0; b < t.B; ++b)
    for (std::int64_t h = 0; h < t.H; ++h)
      for (std::int64_t s = 0; s < t.S; ++s) {
        const std::int64_t r = op.row(b, h, s);
        for (std::int64_t d = 0; d < t.D; ++d) op.values[r * t.D + d] = decode(ElemFormat::e2m1, code_at(t, b, s, h, d));
        for (std::int64_t blk = 0; blk < op.blocks(); ++blk)
          op.block_factor[r * op.blocks() + blk] =
              exp2i(mx_exponent(t.scale_codes[t.scale_index(b, s, h, blk * kMxfp4Block)]));
      }
}

void qk_mx_sm90(const QuantizedTensor& t, std::int64_t fold_rows, QkOperand& op) {
  const std::int64_t blocks = t.D / kMxfp4Block;
  for (std::int64_t b = 0; b < t.B; ++b)
    for (std::int64_t h = 0; h < t.H; ++h)
      for (std::int64_t s0 = 0; s0 < t.S; s0 += fold_rows) {
        const std::int64_t s1 = std::min(t.S, s0 + fold_rows);
        auto exponent = [&](std::int64_t s, std::int64_t blk) {
          return mx_exponent(t.scale_codes[t.scale_index(b, s, h, blk * kMxfp4Block)]);
        };
        int row_exp = direct_p::kNoBlockExponent;
        for (std::int64_t s = s0; s < s1; ++s)
          for (std::int64_t blk = 0; blk < blocks; ++blk) row_exp = std::max(row_exp, exponent(s, blk));
        for (std::int64_t s = s0; s < s1; ++s) {
          const std::int64_t r = op.row(b, h, s);
          op.row_factor[r] = sm90_fold_factor(row_exp);
          for (std::int64_t d = 0; d < t.D; ++d)
            op.values[r * t.D + d] =
                fold_mx_to_e4m3(decode(ElemFormat::e2m1, code_at(t, b, s, h, d)), exponent(s, d / kMxfp4Block), row_exp);
        }
      }
}

void qk_nvfp4(const QuantizedTensor& t, QkOperand& op) {
  const float inv_tensor_scale = 1.0f / t.tensor_scale;
  for (std::int64_t b = 0; b < t.B; ++b)
    for (std::int64_t h = 0; h < t.H; ++h)
      for (std::int64_t s = 0; s < t.S; ++s) {
        const std::int64_t r = op.row(b, h, s);
        op.row_factor[r] = inv_tensor_scale;
        for (std::int64_t d = 0; d < t.D; ++d) op.values[r * t.D + d] = nvfp4_scaled_value(t, b, s, h, d);
      }
}

}  // namespace

QkOperand qk_operand(const QuantizedTensor& t, Target target, std::int64_t fold_rows) {
  if (t.axis != BlockAxis::along_d) throw Error("t", "Q and K must be quantized along D");
  if (fold_rows <= 0) throw Error("fold_rows", "must be positive");
  QkOperand op;
  op.B = t.B, op.H = t.H, op.S = t.S, op.D = t.D;
  op.block = t.D;
  op.values.resize(static_cast<std::size_t>(t.numel()));
  op.block_factor.assign(static_cast<std::size_t>(t.B * t.H * t.S), 1.0f);
  op.row_factor.assign(static_cast<std::size_t>(t.B * t.H * t.S), 1.0f);
  switch (t.format) {
    case TensorFormat::fp8_e4m3: qk_fp8(t, op); break;
    case TensorFormat::mxfp4:
      if (target == Target::sm100) qk_mx_sm100(t, op);
      else qk_mx_sm90(t, fold_rows, op);
      break;
    case TensorFormat::nvfp4: qk_nvfp4(t, op); break;
  }
  return op;
}

VOperand v_operand(const QuantizedTensor& t, Target target) {
  if (t.axis != BlockAxis::along_s) throw Error("t", "V must be quantized along the sequence");
  VOperand op;
  op.B = t.B, op.H = t.H, op.S = t.S, op.D = t.D;
  op.values.resize(static_cast<std::size_t>(t.numel()));
  op.col_factor.assign(static_cast<std::size_t>(t.B * t.H * t.D), 1.0f);
  auto value_at = [&](std::int64_t b, std::int64_t h, std::int64_t s, std::int64_t d) -> float& {
    return op.values[(op.head(b, h) * t.S + s) * t.D + d];
  };
  const std::int64_t sblocks = ceil_div(t.S, kMxfp4Block);
  auto mx_exp = [&](std::int64_t b, std::int64_t sblk, std::int64_t h, std::int64_t d) {
    return mx_exponent(t.scale_codes[t.scale_index(b, sblk * kMxfp4Block, h, d)]);
  };
  for (std::int64_t b = 0; b < t.B; ++b)
    for (std::int64_t h = 0; h < t.H; ++h) {
      float* col = &op.col_factor[op.head(b, h) * t.D];
      switch (t.format) {
        case TensorFormat::fp8_e4m3:
          // One fp32 scale per channel over the whole sequence: it factors out
          // of the sum over keys and is applied once in the epilogue.
          for (std::int64_t d = 0; d < t.D; ++d) col[d] = t.scales[t.scale_index(b, 0, h, d)];
          for (std::int64_t s = 0; s < t.S; ++s)
            for (std::int64_t d = 0; d < t.D; ++d) value_at(b, h, s, d) = decode(ElemFormat::e4m3, code_at(t, b, s, h, d));
          break;
        case TensorFormat::mxfp4:
          if (target == Target::sm100) {
            op.block = kMxfp4Block;
            op.block_factor.resize(static_cast<std::size_t>(t.B * t.H * sblocks * t.D));
            for (std::int64_t sblk = 0; sblk < sblocks; ++sblk)
              for (std::int64_t d = 0; d < t.D; ++d)
                op.block_factor[(op.head(b, h) * sblocks + sblk) * t.D + d] = exp2i(mx_exp(b, sblk, h, d));
            for (std::int64_t s = 0; s < t.S; ++s)
              for (std::int64_t d = 0; d < t.D; ++d) value_at(b, h, s, d) = decode(ElemFormat::e2m1, code_at(t, b, s, h, d));
          } else {
            // sm90: each channel (a column of the PV B operand) is folded into
            // E4M3 with the largest block exponent of the whole sequence, so the
            // factor is constant across key tiles and applied once at the end.
            for (std::int64_t d = 0; d < t.D; ++d) {
              int col_exp = direct_p::kNoBlockExponent;
              for (std::int64_t sblk = 0; sblk < sblocks; ++sblk) col_exp = std::max(col_exp, mx_exp(b, sblk, h, d));
              col[d] = sm90_fold_factor(col_exp);
              for (std::int64_t s = 0; s < t.S; ++s)
                value_at(b, h, s, d) = fold_mx_to_e4m3(decode(ElemFormat::e2m1, code_at(t, b, s, h, d)),
                                                       mx_exp(b, s / kMxfp4Block, h, d), col_exp);
            }
          }
          break;
        case TensorFormat::nvfp4:
          for (std::int64_t d = 0; d < t.D; ++d) col[d] = 1.0f / t.tensor_scale;
          for (std::int64_t s = 0; s < t.S; ++s)
            for (std::int64_t d = 0; d < t.D; ++d) value_at(b, h, s, d) = nvfp4_scaled_value(t, b, s, h, d);
          break;
      }
    }
  return op;
}

}  // namespace fp4attn::emulator
