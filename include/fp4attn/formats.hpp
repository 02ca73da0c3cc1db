// Element codecs of every number format fp4attn uses (DESIGN §3.1).
//
// One generic minifloat codec serves E2M1, E4M3, E5M2 and UE4M3; E8M0 scales
// are pure exponents. Everything is constexpr and __host__ __device__ so the
// CPU emulator and the CUDA kernels round with the very same code: a second
// copy of a rounding rule is the classic source of host/device mismatches.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define FP4ATTN_HD __host__ __device__
#else
#define FP4ATTN_HD
#endif

namespace fp4attn {

FP4ATTN_HD constexpr std::uint32_t float_bits(float x) { return __builtin_bit_cast(std::uint32_t, x); }
FP4ATTN_HD constexpr float bits_float(std::uint32_t b) { return __builtin_bit_cast(float, b); }

// 2^e as a float for any e in [-149, 127] (float subnormals included), exact.
FP4ATTN_HD constexpr float exp2i(int e) {
  if (e < -149) return 0.0f;
  if (e < -126) return bits_float(1u << (e + 149));
  return bits_float(static_cast<std::uint32_t>(e + 127) << 23);
}

enum class ElemFormat : std::uint8_t { e2m1, e4m3, e5m2, ue4m3 };

// Static description of one minifloat layout.
struct MiniFloatSpec {
  int exp_bits;
  int man_bits;
  int bias;
  bool has_sign;
  bool has_inf;          // E5M2 only: exponent all-ones is Inf/NaN (IEEE-like)
  bool has_nan;          // E4M3 (fn): S.1111.111 is NaN; E2M1 has no NaN
  std::uint8_t max_code; // largest finite magnitude code
};

FP4ATTN_HD constexpr MiniFloatSpec spec_of(ElemFormat f) {
  switch (f) {
    case ElemFormat::e2m1: return {2, 1, 1, true, false, false, 0x7};
    case ElemFormat::e4m3: return {4, 3, 7, true, false, true, 0x7E};
    case ElemFormat::e5m2: return {5, 2, 15, true, true, true, 0x7B};
    case ElemFormat::ue4m3: return {4, 3, 7, false, false, true, 0x7E};
  }
  return {0, 0, 0, false, false, false, 0};
}

FP4ATTN_HD constexpr int code_bits(ElemFormat f) {
  const MiniFloatSpec s = spec_of(f);
  return s.exp_bits + s.man_bits + (s.has_sign ? 1 : 0);
}

// Magnitude of a finite code without its sign bit.
FP4ATTN_HD constexpr float decode_magnitude(const MiniFloatSpec& s, std::uint32_t mag) {
  const std::uint32_t ef = mag >> s.man_bits;
  const std::uint32_t m = mag & ((1u << s.man_bits) - 1u);
  const int emin = 1 - s.bias;
  if (ef == 0) return static_cast<float>(m) * exp2i(emin - s.man_bits);
  return static_cast<float>(m + (1u << s.man_bits)) * exp2i(static_cast<int>(ef) - s.bias - s.man_bits);
}

// Code -> float. NaN codes give a quiet NaN, E5M2 infinities give ±Inf.
FP4ATTN_HD constexpr float decode(ElemFormat f, std::uint32_t code) {
  const MiniFloatSpec s = spec_of(f);
  const int width = code_bits(f);
  code &= (1u << width) - 1u;
  const bool neg = s.has_sign && ((code >> (width - 1)) & 1u);
  const std::uint32_t mag = s.has_sign ? code & ((1u << (width - 1)) - 1u) : code;
  const std::uint32_t exp_all_ones = (1u << s.exp_bits) - 1u;
  if (s.has_inf && (mag >> s.man_bits) == exp_all_ones) {
    const float v = (mag & ((1u << s.man_bits) - 1u)) ? bits_float(0x7FC00000u) : bits_float(0x7F800000u);
    return neg ? -v : v;
  }
  if (s.has_nan && !s.has_inf && mag == ((1u << (width - (s.has_sign ? 1 : 0))) - 1u)) return bits_float(0x7FC00000u);
  const float v = decode_magnitude(s, mag);
  return neg ? -v : v;
}

// NaN code of a format (E2M1 has none: returns 0xFF as an impossible code).
FP4ATTN_HD constexpr std::uint8_t nan_code(ElemFormat f) {
  switch (f) {
    case ElemFormat::e2m1: return 0xFF;
    case ElemFormat::e4m3: return 0x7F;
    case ElemFormat::e5m2: return 0x7F;
    case ElemFormat::ue4m3: return 0x7F;
  }
  return 0xFF;
}

// float -> code, round to nearest with ties to even, saturating to the largest
// finite value (CUDA's satfinite). NaN maps to the format's NaN code (callers
// that must not see NaN check first: quantizers report it as an error).
// Unsigned formats take |x|.
FP4ATTN_HD constexpr std::uint8_t encode_rne_sat(ElemFormat f, float x) {
  const MiniFloatSpec s = spec_of(f);
  const std::uint32_t bits = float_bits(x);
  const std::uint32_t sign = (s.has_sign && (bits >> 31)) ? (1u << (code_bits(f) - 1)) : 0u;
  const std::uint32_t abits = bits & 0x7FFFFFFFu;
  if (abits > 0x7F800000u) return nan_code(f);
  const float max_value = decode_magnitude(s, s.max_code);
  if (bits_float(abits) >= max_value) return static_cast<std::uint8_t>(sign | s.max_code);
  const int fe = static_cast<int>(abits >> 23) - 127;
  if (fe < -126) return static_cast<std::uint8_t>(sign);  // float subnormals are far below every format
  const int emin = 1 - s.bias;
  const int te = fe > emin ? fe : emin;  // exponent of the quantum's binade
  const int shift = 23 + te - s.man_bits - fe;  // >= 23 - man_bits > 0
  if (shift > 25) return static_cast<std::uint8_t>(sign);  // below half the smallest subnormal
  const std::uint32_t mant = (abits & 0x7FFFFFu) | 0x800000u;
  std::uint32_t n = mant >> shift;
  const std::uint32_t rem = mant & ((1u << shift) - 1u);
  const std::uint32_t half = 1u << (shift - 1);
  if (rem > half || (rem == half && (n & 1u))) ++n;
  // Subnormals land in exponent field 0, and a mantissa carry moves into the
  // next binade by plain addition, so one formula covers every case.
  const std::uint32_t mag = (static_cast<std::uint32_t>(te + s.bias - 1) << s.man_bits) + n;
  return static_cast<std::uint8_t>(sign | mag);
}

FP4ATTN_HD constexpr float round_to(ElemFormat f, float x) { return decode(f, encode_rne_sat(f, x)); }

// Number of distinct codes a format has (for exhaustive tests).
FP4ATTN_HD constexpr int code_count(ElemFormat f) { return 1 << code_bits(f); }

// ---- E8M0 scales -------------------------------------------------------------
// 2^(e - 127); 0xFF is NaN.
inline constexpr std::uint8_t kE8M0Nan = 0xFF;
inline constexpr int kE8M0Bias = 127;

FP4ATTN_HD constexpr float decode_e8m0(std::uint8_t code) {
  return code == kE8M0Nan ? bits_float(0x7FC00000u) : exp2i(static_cast<int>(code) - kE8M0Bias);
}

// Returned by floor_log2 for zero, below every finite float's exponent.
inline constexpr int kLog2OfZero = -150;

// floor(log2 |x|) for finite x, exact for float subnormals too; kLog2OfZero for 0.
FP4ATTN_HD constexpr int floor_log2(float x) {
  const std::uint32_t a = float_bits(x) & 0x7FFFFFFFu;
  if (a == 0) return kLog2OfZero;
  if ((a >> 23) != 0) return static_cast<int>(a >> 23) - 127;
  int e = -127;
  for (std::uint32_t m = a; m < 0x400000u; m <<= 1) --e;  // subnormal: find the leading one
  return e;
}

// ceil(log2 |x|) for finite nonzero x.
FP4ATTN_HD constexpr int ceil_log2(float x) {
  const int fl = floor_log2(x);
  return bits_float(float_bits(x) & 0x7FFFFFFFu) == exp2i(fl) ? fl : fl + 1;
}

// ---- FP4 packing -------------------------------------------------------------
// Element 2i in the low nibble, 2i+1 in the high nibble (CUDA __nv_fp4x2 .x/.y).
FP4ATTN_HD constexpr std::uint8_t pack_fp4x2(std::uint8_t even, std::uint8_t odd) {
  return static_cast<std::uint8_t>((even & 0xF) | ((odd & 0xF) << 4));
}
FP4ATTN_HD constexpr std::uint8_t fp4_at(const std::uint8_t* packed, std::int64_t i) {
  return static_cast<std::uint8_t>((packed[i >> 1] >> ((i & 1) * 4)) & 0xF);
}

// Largest finite magnitudes, named for the formulas that use them.
inline constexpr float kE2M1Max = 6.0f;
inline constexpr float kE4M3Max = 448.0f;
inline constexpr float kE5M2Max = 57344.0f;

}  // namespace fp4attn
