// Random caller-quantized E4M3 inputs for forward_e4m3's suites (CPU and GPU):
// codes of normal values spread over E4M3's range, descales that differ per
// (batch entry, kv head) by orders of magnitude so that a descale applied to
// the wrong head moves the result far past any tolerance.
#pragma once

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "fp4attn/attention.hpp"
#include "fp4attn/formats.hpp"

namespace fp4attn::e4m3_test {

struct Problem {
  AttentionShape shape;
  std::vector<std::uint8_t> q, k, v;
  std::vector<float> q_descale, k_descale, v_descale;  // (B, Hkv)

  E4m3Inputs inputs() const { return {q, k, v, q_descale, k_descale, v_descale}; }
  // The values the codes stand for, in double, for the fp64 reference.
  std::vector<double> values(const std::vector<std::uint8_t>& codes, const std::vector<float>& descale,
                             std::int64_t S, std::int64_t H, std::int64_t group) const {
    std::vector<double> out(codes.size());
    for (std::size_t i = 0; i < codes.size(); ++i) {
      const auto idx = static_cast<std::int64_t>(i);
      const std::int64_t h = idx / shape.D % H, b = idx / (shape.D * H * S);
      out[i] = static_cast<double>(decode(ElemFormat::e4m3, codes[i])) * descale[b * shape.Hkv + h / group];
    }
    return out;
  }
};

inline std::vector<std::uint8_t> random_codes(std::size_t n, float spread, std::mt19937& rng) {
  std::normal_distribution<float> dist(0.0f, spread);
  std::vector<std::uint8_t> codes(n);
  for (auto& c : codes) c = encode_rne_sat(ElemFormat::e4m3, dist(rng));  // finite in, never the NaN code
  return codes;
}

// Descales log-uniform in [lo, hi].
inline std::vector<float> random_descales(std::size_t n, float lo, float hi, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(std::log2(lo), std::log2(hi));
  std::vector<float> d(n);
  for (auto& x : d) x = std::exp2(u(rng));
  return d;
}

// Scores of a few units (q·k·descales ≈ 1 per channel pair), V of order 1.
inline Problem random_problem(const AttentionShape& shape, std::uint32_t seed) {
  std::mt19937 rng(seed);
  Problem p;
  p.shape = shape;
  const auto q_n = static_cast<std::size_t>(shape.q_elems()), kv_n = static_cast<std::size_t>(shape.kv_elems());
  const auto heads = static_cast<std::size_t>(shape.B * shape.Hkv);
  p.q = random_codes(q_n, 40.0f, rng);
  p.k = random_codes(kv_n, 40.0f, rng);
  p.v = random_codes(kv_n, 100.0f, rng);
  p.q_descale = random_descales(heads, 1.0f / 256, 1.0f / 16, rng);
  p.k_descale = random_descales(heads, 1.0f / 128, 1.0f / 32, rng);
  p.v_descale = random_descales(heads, 1.0f / 512, 1.0f / 4, rng);
  return p;
}

}  // namespace fp4attn::e4m3_test
