// Candidate FP8 P-code sequences for the throughput study (README.md), each as
// a device functor over four raw scores s (u = s·c − m, one FFMA per score, as
// the kernel computes it) and, where it could ship, a host model of its bits.
//
// The shipped sequence lives in include/fp4attn/direct_p.hpp (TwoPhase below
// calls it); the others are kept here with their measurements, not in the
// library.
#pragma once

#include <cstdint>

#include "fp4attn/direct_p.hpp"
#include "fp4attn/formats.hpp"

namespace direct_p_study {

using fp4attn::bits_float;
using fp4attn::float_bits;
namespace direct_p = fp4attn::direct_p;

// ---- shared pieces ------------------------------------------------------------------
__device__ __forceinline__ std::uint32_t f16x2_two_phase(std::uint32_t x) {
  std::uint32_t shifted, v;
  asm("add.u16x2 %0, %1, %2;" : "=r"(shifted) : "r"(x), "r"(direct_p::kFp8HalfStep * 0x10001u));
  asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(v) : "r"(shifted), "r"(direct_p::kF16InvSqrt2Bits * 0x10001u), "r"(x));
  return v;
}

__device__ __forceinline__ std::uint32_t e4m3x4_of_f16x2(std::uint32_t v01, std::uint32_t v23) {
  std::uint32_t codes;
  asm("{\n .reg .b16 lo, hi;\n cvt.rn.satfinite.e4m3x2.f16x2 lo, %1;\n cvt.rn.satfinite.e4m3x2.f16x2 hi, %2;\n"
      " mov.b32 %0, {lo, hi};\n}"
      : "=r"(codes)
      : "r"(v01), "r"(v23));
  return codes;
}

// ---- baseline: MUFU ex2 + F2FP (the kernel's exp2 path) ---------------------------
struct MufuCvt {
  static constexpr const char* kName = "mufu_ex2+cvt";
  // m8 = m − 8: the offset rides on the score FFMA.
  __device__ __forceinline__ static std::uint32_t run(int, float s0, float s1, float s2, float s3, float c, float,
                                                      float m8) {
    const float u[4] = {fmaf(s0, c, -m8), fmaf(s1, c, -m8), fmaf(s2, c, -m8), fmaf(s3, c, -m8)};
    float p[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(p[i]) : "f"(u[i]));
    std::uint32_t codes;
    asm("{\n .reg .b16 lo, hi;\n cvt.rn.satfinite.e4m3x2.f32 lo, %2, %1;\n cvt.rn.satfinite.e4m3x2.f32 hi, %4, %3;\n"
        " mov.b32 %0, {lo, hi};\n}"
        : "=r"(codes)
        : "f"(p[0]), "f"(p[1]), "f"(p[2]), "f"(p[3]));
    return codes;
  }
};

// ---- v0: the previous library sequence (exp2 polynomial + bit extraction) ----------
__host__ __device__ inline std::uint8_t poly_code(float u) {
  constexpr std::uint32_t kRebias = static_cast<std::uint32_t>(127 - 7) << 23;
  constexpr std::uint32_t kHalfDropped = 1u << 19;
  constexpr float kSubnormalScale = 512.0f;
  const float p = direct_p::exp2_poly(u + direct_p::kFp8Offset);
  const std::uint32_t pb = float_bits(p);
  if (p >= fp4attn::exp2i(-6)) return static_cast<std::uint8_t>((pb + kHalfDropped - kRebias) >> 20);
  return static_cast<std::uint8_t>(float_bits(fmaf(p, kSubnormalScale, direct_p::kRoundMagic)) -
                                   float_bits(direct_p::kRoundMagic));
}

struct OldPoly {
  static constexpr const char* kName = "v0 poly (old)";
  __device__ __forceinline__ static std::uint32_t run(int, float s0, float s1, float s2, float s3, float c, float m,
                                                      float) {
    return poly_code(fmaf(s0, c, -m)) | (std::uint32_t{poly_code(fmaf(s1, c, -m))} << 8) |
           (std::uint32_t{poly_code(fmaf(s2, c, -m))} << 16) | (std::uint32_t{poly_code(fmaf(s3, c, -m))} << 24);
  }
};

// ---- v1: two-phase, the shipped sequence -----------------------------------------
struct TwoPhase {
  static constexpr const char* kName = "v1 two-phase (ships)";
  __device__ __forceinline__ static std::uint32_t run(int, float s0, float s1, float s2, float s3, float c, float m,
                                                      float) {
    return direct_p::fp8_codes_x4(fmaf(s0, c, -m), fmaf(s1, c, -m), fmaf(s2, c, -m), fmaf(s3, c, -m));
  }
};

// ---- v2: two-phase with the FMA pipe doing the clamp and the fixed point ---------
// w = sat(u/32 + bias/2^15) clamps, a magic FFMA puts round(2^15·w) in the low
// bits, PRMT packs two: 2 FFMA + ½ PRMT per score instead of 1 FFMA + ½ I2IP.
inline constexpr float kSatScale = 1.0f / 32, kSatOffset = direct_p::kFp8FixedBias / 32768.0f;
inline constexpr float kFixedUnits = 32768.0f, kMagic = 12582912.0f;  // 1.5·2^23: integers in the low bits

__host__ __device__ inline std::uint32_t prmt_fixed_point(float u) {
  float w = fmaf(u, kSatScale, kSatOffset);
  w = w > 0.0f ? (w < 1.0f ? w : 1.0f) : 0.0f;  // fma.rn.sat.f32 (NaN → 0)
  return float_bits(fmaf(w, kFixedUnits, kMagic)) & 0xFFFFu;
}

struct TwoPhasePrmt {
  static constexpr const char* kName = "v2 two-phase, sat+magic+PRMT";
  __device__ __forceinline__ static std::uint32_t pair(float u0, float u1) {
    float w0, w1;
    asm("fma.rn.sat.f32 %0, %1, %2, %3;" : "=f"(w0) : "f"(u0), "f"(kSatScale), "f"(kSatOffset));
    asm("fma.rn.sat.f32 %0, %1, %2, %3;" : "=f"(w1) : "f"(u1), "f"(kSatScale), "f"(kSatOffset));
    return __byte_perm(float_bits(fmaf(w0, kFixedUnits, kMagic)), float_bits(fmaf(w1, kFixedUnits, kMagic)), 0x5410);
  }
  __device__ __forceinline__ static std::uint32_t run(int, float s0, float s1, float s2, float s3, float c, float m,
                                                      float) {
    return e4m3x4_of_f16x2(f16x2_two_phase(pair(fmaf(s0, c, -m), fmaf(s1, c, -m))),
                           f16x2_two_phase(pair(fmaf(s2, c, -m), fmaf(s3, c, -m))));
  }
  static std::uint8_t host_code(float u) {
    return fp4attn::encode_rne_sat(fp4attn::ElemFormat::e4m3,
                                   direct_p::f16_value(direct_p::fp8_two_phase(prmt_fixed_point(u))));
  }
};

// ---- v3: three-phase (thirds of a binade): ±0.34 % instead of ±0.76 % -------------
inline constexpr std::uint32_t kThreeBias = 21872;                // 23 − log2(3.117), in 2^-10
inline constexpr std::uint32_t kThird = 341, kTwoThirds = 683;     // 2^10/3, 2^11/3
inline constexpr std::uint32_t kF16Pow2Neg1_3 = 0x3A59u, kF16Pow2Neg2_3 = 0x390Au;  // 2^-1/3, 2^-2/3
inline constexpr float kThreeOffset = bits_float(kThreeBias);

// Round a non-negative exact double to fp16 bits through fp32 when that is
// exact (checked), then with the library's fp16 rounding.
inline std::uint32_t f16_bits_of_exact(double v) {
  const float f = static_cast<float>(v);
  if (double{f} != v) return 0xFFFFFFFFu;  // never expected: the host model would be wrong
  return direct_p::f16_bits_rne(f);
}

struct ThreePhase {
  static constexpr const char* kName = "v3 three-phase";
  __device__ __forceinline__ static std::uint32_t pair(float u0, float u1) {
    float r0, r1;
    std::uint32_t x, x1, x2, t, v;
    asm("fma.rn.f32 %0, %1, %2, %3;" : "=f"(r0) : "f"(u0), "f"(direct_p::kFp8FixedScale), "f"(kThreeOffset));
    asm("fma.rn.f32 %0, %1, %2, %3;" : "=f"(r1) : "f"(u1), "f"(direct_p::kFp8FixedScale), "f"(kThreeOffset));
    asm("cvt.pack.sat.u16.s32 %0, %1, %2;" : "=r"(x) : "r"(float_bits(r1)), "r"(float_bits(r0)));
    asm("add.u16x2 %0, %1, %2;" : "=r"(x1) : "r"(x), "r"(kThird * 0x10001u));
    asm("add.u16x2 %0, %1, %2;" : "=r"(x2) : "r"(x), "r"(kTwoThirds * 0x10001u));
    asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(t) : "r"(x2), "r"(kF16Pow2Neg2_3 * 0x10001u), "r"(x));
    asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(v) : "r"(x1), "r"(kF16Pow2Neg1_3 * 0x10001u), "r"(t));
    return v;
  }
  __device__ __forceinline__ static std::uint32_t run(int, float s0, float s1, float s2, float s3, float c, float m,
                                                      float) {
    return e4m3x4_of_f16x2(pair(fmaf(s0, c, -m), fmaf(s1, c, -m)), pair(fmaf(s2, c, -m), fmaf(s3, c, -m)));
  }
  static std::uint8_t host_code(float u) {
    const std::int32_t n = static_cast<std::int32_t>(float_bits(fmaf(u, direct_p::kFp8FixedScale, kThreeOffset)));
    const std::uint32_t x = n < 0 ? 0u : n > 0xFFFF ? 0xFFFFu : static_cast<std::uint32_t>(n);
    const double v1 = direct_p::f16_value(x), v2 = direct_p::f16_value(x + kThird),
                 v3 = direct_p::f16_value(x + kTwoThirds);
    const std::uint32_t t = f16_bits_of_exact(v3 * direct_p::f16_value(kF16Pow2Neg2_3) + v1);
    const std::uint32_t v = f16_bits_of_exact(v2 * direct_p::f16_value(kF16Pow2Neg1_3) + direct_p::f16_value(t));
    return fp4attn::encode_rne_sat(fp4attn::ElemFormat::e4m3, direct_p::f16_value(v));
  }
};

// ---- FlashAttention-4's split: some words through MUFU, the rest through v1 -------
// Not bit-exact with the emulator (MUFU's ex2.approx is not modelled); measured
// only to say what keeping both pipes busy would buy.
template <int kMufuEvery>
struct Split {
  static constexpr const char* kName = kMufuEvery == 2 ? "split 1/2 MUFU" : "split 1/4 MUFU";
  __device__ __forceinline__ static std::uint32_t run(int word, float s0, float s1, float s2, float s3, float c,
                                                      float m, float m8) {
    if (word % kMufuEvery == 0) return MufuCvt::run(word, s0, s1, s2, s3, c, m, m8);
    return TwoPhase::run(word, s0, s1, s2, s3, c, m, m8);
  }
};

// ---- row-sum variants: Σ of the four decoded codes of a word ----------------------
struct NoSum {
  static constexpr const char* kName = "";
  static constexpr bool kActive = false;
  __device__ __forceinline__ static float run(std::uint32_t) { return 0.0f; }
};

// The kernel's present decode: code << 20 is a float of value·2^-120, exact.
struct SumShift {
  static constexpr const char* kName = " + l (shift, exact)";
  static constexpr bool kActive = true;
  __device__ __forceinline__ static float run(std::uint32_t w) {
    float l = 0.0f;
#pragma unroll
    for (int b = 0; b < 4; ++b) l += __uint_as_float(((w >> (8 * b)) & 0xFFu) << 20) * 0x1p120f;
    return l;
  }
};

struct SumCvt {
  static constexpr const char* kName = " + l (cvt f16, exact)";
  static constexpr bool kActive = true;
  __device__ __forceinline__ static float run(std::uint32_t w) { return direct_p::fp8_decoded_sum_x4(w); }
};

// Pairs added in fp16 first (one rounding, ≤ 2^-11 of the pair), half the
// conversions to fp32.
struct SumF16Pairs {
  static constexpr const char* kName = " + l (f16 pairs)";
  static constexpr bool kActive = true;
  __device__ __forceinline__ static float run(std::uint32_t w) {
    float lo, hi;
    asm("{\n .reg .b16 c01, c23, s0, s1;\n .reg .b32 h01, h23, s;\n mov.b32 {c01, c23}, %2;\n"
        " cvt.rn.f16x2.e4m3x2 h01, c01;\n cvt.rn.f16x2.e4m3x2 h23, c23;\n add.rn.f16x2 s, h01, h23;\n"
        " mov.b32 {s0, s1}, s;\n cvt.f32.f16 %0, s0;\n cvt.f32.f16 %1, s1;\n}"
        : "=f"(lo), "=f"(hi)
        : "r"(w));
    return lo + hi;
  }
};

}  // namespace direct_p_study
