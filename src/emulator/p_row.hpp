// One row of P for one key tile: log2-domain scores u (DESIGN §3.3) turned
// into the codes of the recipe's P format, by Direct-P or, as the baseline,
// by exp2 followed by the ordinary quantizer of that format.
#pragma once

#include <cstdint>
#include <span>

#include "fp4attn/recipe.hpp"

namespace fp4attn::emulator {

// Largest key tile the emulator accepts (the kernels use 64 to 256); bounds
// the per-row scratch of block exponents.
inline constexpr int kMaxBlockK = 1024;

struct PConfig {
  TensorFormat format = TensorFormat::fp8_e4m3;
  Target target = Target::sm90;
  bool direct_p = true;
  MxScaleRule mx_scale_rule = MxScaleRule::round_up;  // direct_p off: the MX quantizer's rule
};

// log2 of the factor P carries: FP8 and NVFP4 P stand for 2^(u + 8), MXFP4 P
// for 2^u (its own block exponents already cover the whole range).
float p_offset(TensorFormat p);

// Keys per P scale block along the key dimension (1 for FP8 P, which has none).
int p_block(TensorFormat p);

struct PRowResult {
  float row_factor = 1.0f;  // multiplies this row's P·V tile result (sm90 MXFP4 fold)
  float sum = 0.0f;         // Σ of the values the product used: this tile's share of l
};

// Whether the row's FP8 P codes are shared between the curve and MUFU ex2
// (the sm90 kernels' rule: direct_p::sm90_fp8_key_on_mufu).
bool fp8_mufu_share(const PConfig& cfg);

// Whether the row's MXFP4 P codes are shared between the curve and MUFU ex2
// (the sm90 kernels' rule: direct_p::sm90_mxfp4_key_on_mufu).
bool mxfp4_mufu_share(const PConfig& cfg);

// What the kernels feed ex2.approx for the keys on MUFU: the raw scores s of
// the tile, their log2-domain multiplier c and the row maximum m (u = s·c − m).
struct MufuInputs {
  std::span<const float> s;
  float c = 0.0f, m = 0.0f;
};

// u: the tile's scores (-inf where masked). When fp8_mufu_share(cfg) or
// mxfp4_mufu_share(cfg), `mufu` gives the keys on MUFU their ex2 argument
// (FP8: s·c − (m − 8); MXFP4: s·c − direct_p::mxfp4_mufu_shift(m, E)) and
// first_key is the absolute index of the tile's first key; otherwise both are
// unused. Writes `value` (what the P·V instruction multiplies, one per key)
// and, for block-scaled MXFP4 on sm100, `block_factor` (2^E per 32 keys; 1
// otherwise). Blocks start at the tile's first key: block_k is a multiple of
// 32, so a block never straddles tiles.
PRowResult make_p_row(const PConfig& cfg, std::span<const float> u, const MufuInputs& mufu, std::int64_t first_key,
                      std::span<float> value, std::span<float> block_factor);

}  // namespace fp4attn::emulator
