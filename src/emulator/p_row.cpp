#include "emulator/p_row.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "emulator/ex2_sm90.hpp"
#include "emulator/operands.hpp"
#include "fp4attn/direct_p.hpp"
#include "fp4attn/error.hpp"
#include "fp4attn/formats.hpp"
#include "fp4attn/quantize.hpp"

namespace fp4attn::emulator {
namespace {

// Scale-free NVFP4 P: Direct-P picks s_b from 2^(u_max + 8) / 6 alone, which is
// the NVFP4 quantizer's rule with S_enc = 1 (P's own range (0, 256] already
// suits E4M3 block scales). The exp2 baseline uses the same tensor scale.
constexpr float kPTensorScale = 1.0f;

float max_of(std::span<const float> x) {
  float m = -INFINITY;
  for (float v : x) m = std::max(m, v);
  return m;
}

// Direct-P off: ex2_for_target gives the target's exp2 (sm90: the hardware's
// ex2.approx wherever it decides a code), so the codes match the kernel's.
// sm90 Direct-P: the keys on MUFU round ex2.approx(x) to E4M3, the rest
// take the curve.
float fp8_row(const PConfig& cfg, std::span<const float> u, const MufuInputs& mufu, std::int64_t first_key,
              std::span<float> value) {
  const bool share = fp8_mufu_share(cfg);
  // ex2's argument with P's offset folded into m, as the kernel forms it.
  const float m8 = mufu.m - direct_p::kFp8Offset;
  float sum = 0.0f;
  for (std::size_t j = 0; j < u.size(); ++j) {
    std::uint8_t code;
    if (share && direct_p::sm90_fp8_key_on_mufu(first_key + static_cast<std::int64_t>(j)))
      code = encode_rne_sat(ElemFormat::e4m3, ex2::sm90(direct_p::log2_score(mufu.s[j], mufu.c, m8)));
    else
      code = cfg.direct_p ? direct_p::fp8_code(u[j]) : fp8_code_exp2(cfg.target, u[j]);
    value[j] = decode(ElemFormat::e4m3, code);
    sum += value[j];
  }
  return sum;
}

// E2M1 values of one 32-key block into q; returns the block exponent E. The
// block starts at index j0 of the tile's row, whose first key is first_key;
// the keys on MUFU (mxfp4_mufu_share) read their raw scores from mufu.s.
int mx_block(const PConfig& cfg, std::span<const float> u, const MufuInputs& mufu, std::size_t j0,
             std::int64_t first_key, float* q) {
  if (cfg.direct_p) {
    const int e = direct_p::mx_block_exponent(max_of(u));
    const bool share = mxfp4_mufu_share(cfg);
    const float shift = direct_p::mxfp4_mufu_shift(mufu.m, e);
    for (std::size_t j = 0; j < u.size(); ++j) {
      const std::int64_t key = first_key + static_cast<std::int64_t>(j0 + j);
      const std::uint8_t code =
          share && direct_p::sm90_mxfp4_key_on_mufu(key)
              ? direct_p::mxfp4_code_of_mufu(ex2::sm90(direct_p::log2_score(mufu.s[j0 + j], mufu.c, shift)))
              : direct_p::mxfp4_code(u[j], e);
      q[j] = decode(ElemFormat::e2m1, code);
    }
    return e;
  }
  float amax = 0.0f;
  for (std::size_t j = 0; j < u.size(); ++j) {
    q[j] = ex2_for_target(cfg.target, u[j]);
    amax = std::max(amax, q[j]);
  }
  const std::uint8_t scale = mx_scale_code(amax, cfg.mx_scale_rule);
  // An all-zero block gets the smallest scale; name it as Direct-P does so the
  // sm90 row exponent ignores it either way.
  const int e = amax > 0.0f ? mx_exponent(scale) : direct_p::kNoBlockExponent;
  const float inv = exp2i(-mx_exponent(scale));  // exact, as in the MX quantizer
  for (std::size_t j = 0; j < u.size(); ++j) q[j] = decode(ElemFormat::e2m1, encode_rne_sat(ElemFormat::e2m1, q[j] * inv));
  return e;
}

PRowResult mx_row(const PConfig& cfg, std::span<const float> u, const MufuInputs& mufu, std::int64_t first_key,
                  std::span<float> value, std::span<float> block_factor) {
  const std::size_t n = u.size();
  int exps[kMaxBlockK / kMxfp4Block] = {};
  if (n == 0) return {};
  const std::size_t blocks = (n + kMxfp4Block - 1) / kMxfp4Block;
  for (std::size_t blk = 0; blk < blocks; ++blk) {
    const std::size_t j0 = blk * kMxfp4Block, len = std::min<std::size_t>(kMxfp4Block, n - j0);
    exps[blk] = mx_block(cfg, u.subspan(j0, len), mufu, j0, first_key, &value[j0]);
  }
  PRowResult r;
  if (cfg.target == Target::sm100) {
    // Block-scaled MMA: E2M1 values with 2^E applied per 32-key block.
    for (std::size_t blk = 0; blk < blocks; ++blk) block_factor[blk] = exp2i(exps[blk]);
    for (std::size_t j = 0; j < n; ++j) r.sum += value[j] * block_factor[j / kMxfp4Block];
    return r;
  }
  // sm90: the row of P is folded into E4M3 (§3.4) against R = −2, the largest
  // exponent a block can have (u ≤ 0, so E = ceil(u_max − log2 6) ≤ −2): the
  // values are q·2^(E + 8), P's range as in FP8 P = 2^(u + 8), and the row
  // factor 2^-8 is a constant the kernel folds into the LSE like FP8 P's
  // offset. Blocks below E = −16 lose precision or vanish, as FP8 P does
  // below u ≈ −17, and l counts exactly what remains.
  const int row_exp = kSm90PRowExponent;
  for (std::size_t blk = 0; blk < blocks; ++blk) {
    if (exps[blk] > row_exp) throw Error("u", "an MXFP4 P block above the row maximum: the fold would clip it");
    block_factor[blk] = 1.0f;
  }
  for (std::size_t j = 0; j < n; ++j) {
    value[j] = fold_mx_to_e4m3(value[j], exps[j / kMxfp4Block], row_exp);
    r.sum += value[j];
  }
  r.row_factor = sm90_fold_factor(row_exp);
  r.sum *= r.row_factor;  // a power of two: the same as scaling every term
  return r;
}

// NVFP4 P value q·s_b: exactly a BF16 value, fed to the BF16 product as is.
float nvfp4_row(const PConfig& cfg, std::span<const float> u, std::span<float> value) {
  float sum = 0.0f;
  for (std::size_t j0 = 0; j0 < u.size(); j0 += kNvfp4Block) {
    const std::size_t len = std::min<std::size_t>(kNvfp4Block, u.size() - j0);
    const std::span<const float> ub = u.subspan(j0, len);
    std::uint8_t scale = 0;
    if (cfg.direct_p) {
      scale = direct_p::nvfp4_block_scale(max_of(ub));
    } else {
      float amax = 0.0f;
      for (std::size_t j = 0; j < len; ++j) {
        value[j0 + j] = ex2_for_target(cfg.target, ub[j] + direct_p::kNvfp4Offset);
        amax = std::max(amax, value[j0 + j]);
      }
      scale = nvfp4_block_scale_code(amax, kPTensorScale);
    }
    const float sb = decode(ElemFormat::ue4m3, scale);
    // A zero scale means every key of the block is masked (or underflows): all codes 0.
    const float log2_sb = sb > 0.0f && cfg.direct_p ? direct_p::log2_of_ue4m3(scale) : 0.0f;
    for (std::size_t j = 0; j < len; ++j) {
      std::uint8_t code = 0;
      if (sb > 0.0f)
        code = cfg.direct_p ? direct_p::nvfp4_code(ub[j], log2_sb)
                            : encode_rne_sat(ElemFormat::e2m1, (value[j0 + j] * kPTensorScale) / sb);
      value[j0 + j] = decode(ElemFormat::e2m1, code) * sb;
      sum += value[j0 + j];
    }
  }
  return sum;
}

}  // namespace

float p_offset(TensorFormat p) {
  switch (p) {
    case TensorFormat::fp8_e4m3: return direct_p::kFp8Offset;
    case TensorFormat::mxfp4: return 0.0f;
    case TensorFormat::nvfp4: return direct_p::kNvfp4Offset;
  }
  return 0.0f;
}

int p_block(TensorFormat p) {
  switch (p) {
    case TensorFormat::fp8_e4m3: return 1;
    case TensorFormat::mxfp4: return kMxfp4Block;
    case TensorFormat::nvfp4: return kNvfp4Block;
  }
  return 1;
}

bool fp8_mufu_share(const PConfig& cfg) {
  return cfg.format == TensorFormat::fp8_e4m3 && cfg.target == Target::sm90 && cfg.direct_p;
}

bool mxfp4_mufu_share(const PConfig& cfg) {
  return cfg.format == TensorFormat::mxfp4 && cfg.target == Target::sm90 && cfg.direct_p;
}

PRowResult make_p_row(const PConfig& cfg, std::span<const float> u, const MufuInputs& mufu, std::int64_t first_key,
                      std::span<float> value, std::span<float> block_factor) {
  switch (cfg.format) {
    case TensorFormat::fp8_e4m3: return {1.0f, fp8_row(cfg, u, mufu, first_key, value)};
    case TensorFormat::mxfp4: return mx_row(cfg, u, mufu, first_key, value, block_factor);
    case TensorFormat::nvfp4: return {1.0f, nvfp4_row(cfg, u, value)};
  }
  return {};
}

}  // namespace fp4attn::emulator
