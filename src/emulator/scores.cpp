#include "emulator/scores.hpp"

#include <algorithm>

#include "emulator/tensor_core.hpp"
#include "fp4attn/error.hpp"

namespace fp4attn::emulator {

void load_key_tile(const QkOperand& k, std::int64_t b, std::int64_t h, std::int64_t j0, std::int64_t kn, KeyTile& t) {
  const std::int64_t D = k.D, blocks = k.blocks(), bk = t.block_k;
  t.kn = kn;
  for (std::int64_t j = 0; j < kn; ++j) {
    const float* row = k.values_of(b, h, j0 + j);
    for (std::int64_t d = 0; d < D; ++d) t.values[d * bk + j] = row[d];
    const float* bf = k.block_factors_of(b, h, j0 + j);
    for (std::int64_t blk = 0; blk < blocks; ++blk) t.block_factor[blk * bk + j] = bf[blk];
    t.row_factor[j] = k.row_factor[k.row(b, h, j0 + j)];
  }
  for (std::int64_t d = 0; d < D; ++d) e4m3_exponents(&t.values[d * bk], kn, &t.exponents[d * bk]);
}

namespace {

// The kernel's S tile: a zero accumulator, then one wgmma k32 step per 32 channels.
float fp8_mma_score_row(const QkOperand& q, std::int64_t b, std::int64_t h, std::int64_t i, KeyTile& keys, float* s) {
  const std::int64_t kn = keys.kn, bk = keys.block_k;
  if (q.blocks() != 1) throw Error("q", "the FP8 wgmma model needs operands without inner block scales");
  for (std::int64_t j = 1; j < kn; ++j)
    if (keys.row_factor[j] != keys.row_factor[0]) throw Error("k", "the FP8 wgmma model needs one K factor per tile");
  const float* qv = q.values_of(b, h, i);
  e4m3_exponents(qv, q.D, keys.q_exponents.data());
  std::fill_n(s, kn, 0.0f);
  for (std::int64_t d = 0; d < q.D; d += kFp8MmaK)
    fp8_mma_step(qv + d, &keys.q_exponents[d], &keys.values[d * bk], &keys.exponents[d * bk], bk, kFp8MmaK, kn, s,
                 keys.mma_scratch.data());
  return q.row_factor[q.row(b, h, i)] * keys.row_factor[0];
}

}  // namespace

float score_row(const QkOperand& q, std::int64_t b, std::int64_t h, std::int64_t i, KeyTile& keys, bool fp8_mma,
                float* s) {
  if (fp8_mma) return fp8_mma_score_row(q, b, h, i, keys, s);
  const std::int64_t kn = keys.kn, bk = keys.block_k;
  const float* qv = q.values_of(b, h, i);
  const float* qb = q.block_factors_of(b, h, i);
  const float qr = q.row_factor[q.row(b, h, i)];
  float* partial = keys.partial.data();
  std::fill_n(s, kn, 0.0f);
  for (std::int64_t blk = 0; blk < q.blocks(); ++blk) {
    std::fill_n(partial, kn, 0.0f);
    for (std::int64_t d = blk * q.block; d < (blk + 1) * q.block; ++d) {
      const float a = qv[d];
      const float* kd = &keys.values[d * bk];
      for (std::int64_t j = 0; j < kn; ++j) partial[j] += a * kd[j];
    }
    // Block-scaled FP4 (sm100) applies 2^(Eq + Ek) to each 32-block's exact
    // sum; every other operand has one block with factor 1 (exact no-op).
    const float* kb = &keys.block_factor[blk * bk];
    for (std::int64_t j = 0; j < kn; ++j) s[j] += partial[j] * (qb[blk] * kb[j]);
  }
  // FP8 tensor scales, the sm90 fold factors, NVFP4 tensor scales.
  for (std::int64_t j = 0; j < kn; ++j) s[j] *= qr * keys.row_factor[j];
  return 1.0f;
}

float smooth_k_shift(const QuantizedInputs& in, const AttentionShape& shape, float scale, std::int64_t b,
                     std::int64_t hq, std::int64_t i) {
  if (in.k_mean.empty()) return 0.0f;
  const std::int64_t D = shape.D;
  const float* mean = &in.k_mean[(b * shape.Hkv + hq / shape.group()) * D];
  float dot = 0.0f;
  for (std::int64_t d = 0; d < D; ++d) dot += in.q.value(b, i, hq, d) * mean[d];
  return scale * dot;
}

}  // namespace fp4attn::emulator
