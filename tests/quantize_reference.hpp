// The quantizer rules of DESIGN §3.2 written out plainly for the tests: scale
// exponents by exact search in double, element rounding by nearest-value
// search with ties to the even code, blocks enumerated one by one. fp32 is
// used only where the recipe pins fp32 arithmetic.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "fp4attn/formats.hpp"
#include "fp4attn/quantize.hpp"
#include "fp4attn/tensor.hpp"

namespace fp4attn::test_support {

inline constexpr double kMxElementMax = 6.0;
inline constexpr float kNvfp4Numerator = 2688.0f;  // 6 · 448, the pinned NVFP4 recipe

struct Shape {
  std::int64_t B, S, H, D;
  std::int64_t numel() const { return B * S * H * D; }
};

inline ElemFormat element_format(TensorFormat f) {
  return f == TensorFormat::fp8_e4m3 ? ElemFormat::e4m3 : ElemFormat::e2m1;
}

// Round-to-nearest-even by searching the format's values, in double.
inline std::uint8_t nearest_code(ElemFormat f, double y) {
  const int top = spec_of(f).max_code;
  const double a = std::fabs(y);
  int best = 0;
  for (int c = 1; c <= top; ++c) {
    const double dc = std::fabs(decode(f, c) - a), db = std::fabs(decode(f, best) - a);
    if (dc < db || (dc == db && c % 2 == 0)) best = c;
  }
  const bool negative = std::signbit(y) && f != ElemFormat::ue4m3;
  return static_cast<std::uint8_t>(best | (negative ? 1 << (code_bits(f) - 1) : 0));
}

// MX scale exponent by exact search: the smallest k with amax <= 6·2^k (round
// up), or floor(log2 amax) - 2 (OCP), as an E8M0 code.
inline std::uint8_t reference_mx_code(float amax, MxScaleRule rule) {
  if (amax == 0.0f) return 0;
  int k = std::ilogb(static_cast<double>(amax)) - 2;
  if (rule == MxScaleRule::round_up) {
    while (amax > std::ldexp(kMxElementMax, k)) ++k;
    while (amax <= std::ldexp(kMxElementMax, k - 1)) --k;
  }
  return static_cast<std::uint8_t>(std::clamp(k + kE8M0Bias, 0, kE8M0Nan - 1));
}

// One scale block: its elements (flat indices) and its position in the scale array.
struct Block {
  std::vector<std::int64_t> elems;
  std::int64_t scale_pos;
};

// Blocks written out per DESIGN §3.2 and the layout comment of QuantizedTensor.
inline std::vector<Block> blocks_of(const Shape& sh, TensorFormat f, BlockAxis axis, int token_block) {
  std::vector<Block> out;
  const auto idx = [&](std::int64_t b, std::int64_t s, std::int64_t h, std::int64_t d) {
    return bshd_index(sh.S, sh.H, sh.D, b, s, h, d);
  };
  const std::int64_t n = f == TensorFormat::mxfp4 ? kMxfp4Block : kNvfp4Block;
  if (f == TensorFormat::fp8_e4m3 && axis == BlockAxis::along_d) {
    const std::int64_t nt = (sh.S + token_block - 1) / token_block;
    for (std::int64_t b = 0; b < sh.B; ++b)
      for (std::int64_t h = 0; h < sh.H; ++h)
        for (std::int64_t t = 0; t < nt; ++t) {
          Block blk{{}, (b * sh.H + h) * nt + t};
          for (std::int64_t s = t * token_block; s < std::min(sh.S, (t + 1) * token_block); ++s)
            for (std::int64_t d = 0; d < sh.D; ++d) blk.elems.push_back(idx(b, s, h, d));
          out.push_back(blk);
        }
  } else if (f == TensorFormat::fp8_e4m3) {
    for (std::int64_t b = 0; b < sh.B; ++b)
      for (std::int64_t h = 0; h < sh.H; ++h)
        for (std::int64_t d = 0; d < sh.D; ++d) {
          Block blk{{}, (b * sh.H + h) * sh.D + d};
          for (std::int64_t s = 0; s < sh.S; ++s) blk.elems.push_back(idx(b, s, h, d));
          out.push_back(blk);
        }
  } else if (axis == BlockAxis::along_d) {
    for (std::int64_t b = 0; b < sh.B; ++b)
      for (std::int64_t s = 0; s < sh.S; ++s)
        for (std::int64_t h = 0; h < sh.H; ++h)
          for (std::int64_t j = 0; j < sh.D / n; ++j) {
            Block blk{{}, ((b * sh.S + s) * sh.H + h) * (sh.D / n) + j};
            for (std::int64_t d = j * n; d < (j + 1) * n; ++d) blk.elems.push_back(idx(b, s, h, d));
            out.push_back(blk);
          }
  } else {
    const std::int64_t ns = (sh.S + n - 1) / n;
    for (std::int64_t b = 0; b < sh.B; ++b)
      for (std::int64_t j = 0; j < ns; ++j)
        for (std::int64_t h = 0; h < sh.H; ++h)
          for (std::int64_t d = 0; d < sh.D; ++d) {
            Block blk{{}, ((b * ns + j) * sh.H + h) * sh.D + d};
            for (std::int64_t s = j * n; s < std::min(sh.S, (j + 1) * n); ++s) blk.elems.push_back(idx(b, s, h, d));
            out.push_back(blk);
          }
  }
  return out;
}

inline float block_amax(const std::vector<float>& x, const Block& blk) {
  float m = 0.0f;
  for (std::int64_t i : blk.elems) m = std::max(m, std::fabs(x[i]));
  return m;
}

// The rule re-implemented; fp32 only where the recipe pins fp32 arithmetic.
inline QuantizedTensor reference_quantize(const std::vector<float>& x, const Shape& sh, TensorFormat f, BlockAxis axis,
                                          const QuantizeOptions& opt) {
  QuantizedTensor t;
  t.codes.assign(x.size(), 0);
  const std::vector<Block> blocks = blocks_of(sh, f, axis, opt.fp8_token_block);
  t.scales.assign(blocks.size(), 0.0f);
  if (f != TensorFormat::fp8_e4m3) t.scale_codes.assign(blocks.size(), 0);
  if (f == TensorFormat::nvfp4) {
    const float amax =
        *std::max_element(x.begin(), x.end(), [](float a, float b) { return std::fabs(a) < std::fabs(b); });
    t.tensor_scale = amax == 0.0f ? 1.0f : kNvfp4Numerator / std::fabs(amax);
  }
  for (const Block& blk : blocks) {
    const float amax = block_amax(x, blk);
    if (f == TensorFormat::fp8_e4m3) {
      const float scale = amax == 0.0f ? 1.0f : amax / kE4M3Max;
      t.scales[blk.scale_pos] = scale;
      for (std::int64_t i : blk.elems) t.codes[i] = nearest_code(ElemFormat::e4m3, x[i] / scale);
    } else if (f == TensorFormat::mxfp4) {
      const std::uint8_t code = reference_mx_code(amax, opt.mx_scale_rule);
      t.scale_codes[blk.scale_pos] = code;
      t.scales[blk.scale_pos] = static_cast<float>(std::ldexp(1.0, code - kE8M0Bias));
      for (std::int64_t i : blk.elems)
        t.codes[i] = nearest_code(ElemFormat::e2m1, std::ldexp(double{x[i]}, kE8M0Bias - code));
    } else {
      const std::uint8_t code = nearest_code(ElemFormat::ue4m3, (amax * t.tensor_scale) / kE2M1Max);
      const float sb = decode(ElemFormat::ue4m3, code);
      t.scale_codes[blk.scale_pos] = code;
      t.scales[blk.scale_pos] = sb;
      for (std::int64_t i : blk.elems)
        t.codes[i] = sb == 0.0f ? 0 : nearest_code(ElemFormat::e2m1, (x[i] * t.tensor_scale) / sb);
    }
  }
  return t;
}

// Gaussian values whose magnitude changes by up to 2^±`spread` every few
// elements, and one stretch of zeros, so blocks see very different maxima.
inline std::vector<float> varied_tensor(const Shape& sh, std::uint32_t seed, int spread = 12) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  std::uniform_int_distribution<int> exponent(-spread, spread);
  std::vector<float> x(static_cast<std::size_t>(sh.numel()));
  constexpr std::size_t kRun = 8;
  constexpr std::ptrdiff_t kZeros = 64;
  float mag = 1.0f;
  for (std::size_t i = 0; i < x.size(); ++i) {
    if (i % kRun == 0) mag = std::ldexp(1.0f, exponent(rng));
    x[i] = normal(rng) * mag;
  }
  const auto zeros = x.begin() + static_cast<std::ptrdiff_t>(x.size() / 3);
  std::fill(zeros, zeros + kZeros, 0.0f);
  return x;
}

}  // namespace fp4attn::test_support
