// Shared by the .npy and .safetensors readers: element decoding, overflow-safe
// element counts, and little-endian loads from untrusted byte spans.
#pragma once

#include <cmath>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "fp4attn/error.hpp"
#include "fp4attn/formats.hpp"
#include "fp4attn/io.hpp"

namespace fp4attn::io::detail {

inline std::size_t item_size(DType t) { return t == DType::f32 ? 4 : 2; }

// IEEE binary16 -> float, exact (every half is a float).
inline float half_to_float(std::uint16_t h) {
  constexpr int kManBits = 10;
  constexpr int kExpMask = 0x1F;
  constexpr int kBias = 15;
  constexpr int kSignShift = 15;
  const bool neg = (h >> kSignShift) != 0;
  const int e = (h >> kManBits) & kExpMask;
  const int m = h & ((1 << kManBits) - 1);
  float v = 0.0f;
  if (e == kExpMask) {
    v = m == 0 ? INFINITY : NAN;
  } else if (e == 0) {
    v = std::ldexp(static_cast<float>(m), 1 - kBias - kManBits);  // subnormal
  } else {
    v = std::ldexp(static_cast<float>(m + (1 << kManBits)), e - kBias - kManBits);
  }
  return neg ? -v : v;
}

// bfloat16 is the top half of a float.
inline float bf16_to_float(std::uint16_t b) { return bits_float(static_cast<std::uint32_t>(b) << 16); }

inline std::uint64_t load_le(const std::uint8_t* p, int bytes) {
  std::uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

// Product of the dims, or an Error when it leaves 64 bits: a corrupt header must
// not turn into a small, wrapped allocation.
inline std::uint64_t element_count(const std::vector<std::int64_t>& shape, const std::string& source) {
  std::uint64_t n = 1;
  for (std::int64_t d : shape) {
    if (d < 0) throw Error(source, "negative dimension " + std::to_string(d));
    if (__builtin_mul_overflow(n, static_cast<std::uint64_t>(d), &n))
      throw Error(source, "shape is absurd: its element count overflows 64 bits");
  }
  return n;
}

inline std::string shape_string(const std::vector<std::int64_t>& shape) {
  std::string s = "(";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + ")";
}

// Widens `count` little-endian elements of type `t` from `bytes`, which the
// caller has checked holds exactly count · item_size(t) bytes.
inline std::vector<float> decode_elements(std::span<const std::uint8_t> bytes, DType t, std::size_t count) {
  std::vector<float> out(count);
  const std::uint8_t* p = bytes.data();
  for (std::size_t i = 0; i < count; ++i) {
    switch (t) {
      case DType::f32: out[i] = bits_float(static_cast<std::uint32_t>(load_le(p + 4 * i, 4))); break;
      case DType::f16: out[i] = half_to_float(static_cast<std::uint16_t>(load_le(p + 2 * i, 2))); break;
      case DType::bf16: out[i] = bf16_to_float(static_cast<std::uint16_t>(load_le(p + 2 * i, 2))); break;
    }
  }
  return out;
}

}  // namespace fp4attn::io::detail
