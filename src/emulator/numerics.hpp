// Small numeric rules shared by the emulator's forward and backward passes.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "fp4attn/formats.hpp"
#include "fp4attn/recipe.hpp"

namespace fp4attn::emulator {

inline constexpr float kLn2 = 0.6931471805599453f;

// fp32 -> bf16 -> fp32, round to nearest even, as the kernels store O. Adding
// 0x7FFF plus the lowest kept bit to the bits rounds half to even; NaN is kept
// quiet explicitly because that addition could carry it into Inf.
inline float round_to_bf16(float x) {
  constexpr std::uint32_t kDroppedBits = 16;
  constexpr std::uint32_t kHalfMinusOne = 0x7FFFu;
  constexpr std::uint32_t kKeepMask = 0xFFFF0000u;
  constexpr std::uint32_t kQuietBit = 0x00400000u;
  const std::uint32_t bits = float_bits(x);
  if (std::isnan(x)) return bits_float((bits | kQuietBit) & kKeepMask);
  const std::uint32_t lsb = (bits >> kDroppedBits) & 1u;
  return bits_float((bits + kHalfMinusOne + lsb) & kKeepMask);
}

// The keys query row i sees under the options' mask and window (recipe.hpp).
// Causal is bottom-right aligned when Sq != Sk (DESIGN §4).
inline KeyRange visible_keys(const AttentionOptions& opt, std::int64_t Sq, std::int64_t Sk, std::int64_t i) {
  return fp4attn::visible_keys(opt.mask, opt.window, Sq, Sk, i);
}

// The part of a key tile [j0, j0 + kn) that row keys `keys` sees, as offsets
// into the tile; lo >= hi when it sees none of it.
struct TileKeys {
  std::int64_t lo = 0, hi = 0;
};
inline TileKeys keys_in_tile(KeyRange keys, std::int64_t j0, std::int64_t kn) {
  return {std::max<std::int64_t>(keys.first - j0, 0), std::min<std::int64_t>(keys.end - j0, kn)};
}

// softmax_scale 0 means 1/sqrt(D), the usual attention temperature.
// The emulator's unit along D: MXFP4 Q and K blocks and the FP8 tensor core's
// k32 steps. forward and backward on host arrays run any other D with zero
// channels appended up to a multiple of it.
inline constexpr std::int64_t kChannelBlock = 32;

inline float resolve_softmax_scale(float softmax_scale, std::int64_t D) {
  return softmax_scale != 0.0f ? softmax_scale : 1.0f / std::sqrt(static_cast<float>(D));
}

inline std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

}  // namespace fp4attn::emulator
