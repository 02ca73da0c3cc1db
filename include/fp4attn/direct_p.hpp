// Direct-P: attention scores mapped straight to the codes of the format that the
// P·V product consumes (DESIGN §3.3). Shared verbatim by the CPU emulator and the
// CUDA kernels, so both produce the same codes bit for bit.
//
// Inputs are log2-domain scores u = (s·scale − m)·log2(e) ≤ 0, m the running row
// maximum. Every product that could be fused differently by host and device
// compilers is written as an explicit fmaf, so the result does not depend on
// -ffp-contract or --fmad.
#pragma once

#include <cmath>
#include <cstdint>

#include "fp4attn/formats.hpp"

namespace fp4attn::direct_p {

inline constexpr float kLog2e = 1.4426950408889634f;
// FP8 P is 2^(u + 8): the row maximum maps to 256, so P stays in (0, 256] and
// uses E4M3's top binades instead of squeezing probabilities into [0, 1].
inline constexpr float kFp8Offset = 8.0f;
// Same offset for NVFP4 P, so its E4M3 block scales (P_max / 6 ≤ 42.7) sit
// well inside E4M3's range.
inline constexpr float kNvfp4Offset = 8.0f;

// 1.5·2^23: adding it to |x| < 2^22 rounds x to the nearest integer in the low
// mantissa bits (round to nearest even), an FADD instead of an FRND.
inline constexpr float kRoundMagic = 12582912.0f;
// Below 2^-12 every format's code is zero (E4M3's smallest step is 2^-9);
// clamping keeps the exponent arithmetic in the normal float range.
inline constexpr float kMinExp2Arg = -12.0f;
// Degree-2 fit of 2^f on [-0.5, 0.5]; max relative error 1.73e-3, far below the
// 1 % band of the Direct-P contract and the 6 % spacing of E4M3 codes.
inline constexpr float kExp2C0 = 0x1.001d08p+0f;
inline constexpr float kExp2C1 = 0x1.6829a8p-1f;
inline constexpr float kExp2C2 = 0x1.e84bbep-3f;

// log2-domain score: u = s·scale_log2 − m_log2, one FFMA.
FP4ATTN_HD inline float log2_score(float s, float scale_log2, float m_log2) {
  return fmaf(s, scale_log2, -m_log2);
}

// ≈ 2^t for t ≤ 128 as a float, from round(t) and a quadratic of the remainder:
// 3 FADD + 2 FFMA + 2 integer ops, no MUFU. Returns 2^-12-ish for t < -12.
FP4ATTN_HD inline float exp2_poly(float t) {
  t = t > kMinExp2Arg ? t : kMinExp2Arg;
  const float r = t + kRoundMagic;
  const float j = r - kRoundMagic;
  const std::int32_t ji = static_cast<std::int32_t>(float_bits(r) - float_bits(kRoundMagic));
  const float f = t - j;  // in [-0.5, 0.5]
  const float p = fmaf(fmaf(kExp2C2, f, kExp2C1), f, kExp2C0);
  return bits_float(float_bits(p) + (static_cast<std::uint32_t>(ji) << 23));
}

// ---- FP8 P -----------------------------------------------------------------
// The E4M3 code of P = 2^(u + 8) in three instructions per score after u, none
// of them MUFU, FRND or a float-to-FP8 conversion of an exact exp (DESIGN §3.3,
// §4.1; measured against MUFU ex2 + F2FP in dev/direct_p_throughput):
//
//  1. x = round(2^10·u) + kFp8FixedBias as an unsigned 16-bit integer,
//     saturated. One FFMA per score puts u·2^10 + bias on fp32's denormal grid,
//     where a float's bit pattern is the fixed-point integer itself (the FFMA
//     rounds to nearest even on that grid); I2IP (cvt.pack.sat.u16.s32) packs
//     two of them into one register and saturates, which maps every u below
//     −bias/2^10 ≈ −21.9 (and u = −inf) to x = 0.
//  2. Read as fp16 bits, x is the piecewise-linear 2^y of y = x/2^10 − 15: exact
//     at integer y, up to 6.2 % high in between. The same curve half a binade
//     later, x + 2^9, peaks where the first is exact, so
//     v = fp16(x) + 2^-1/2 · fp16(x + 2^9)  (VIADD.16x2 + HFMA2 for two scores)
//     stays within ±0.755 % of 2.076·2^y. The bias absorbs the 2.076 and the
//     offset 8: v ≈ 2^(u + 8) = P.
//  3. cvt.rn.satfinite.e4m3x2.f16x2 rounds two v to E4M3 (subnormals too).
//
// Error of v against P: ±0.755 % (curve) + 0.034 % (the integer bias) + 0.034 %
// (x rounds u to 2^-11) + 0.049 % (v rounds to fp16) = 0.87 % < 1 %, so a code
// differs from round-to-nearest of the exact P only within the contract's 1 %
// band around a boundary, by one step; every step is monotone in u, so the
// code is too. The host functions
// below model the GPU instructions exactly (tests/test_direct_p.cpp, and the
// H200 run in dev/direct_p_throughput/).
//
// Precondition: u ≤ 1 or u = −inf (u = s·c − m with m the row maximum); NaN is
// not a score.

inline constexpr int kFp8FixedFractionBits = 10;
// x = 2^10·(u + 21.946): 23 − log2(2.076) centers v's error on 2^(u + 8).
inline constexpr std::uint32_t kFp8FixedBias = 22473;
inline constexpr std::uint32_t kFp8FixedMax = 0xFFFFu;  // I2IP saturates to u16
// u·2^-139 + bias·2^-149: one unit of the denormal grid (2^-149) is 2^-10 of u.
inline constexpr float kFp8FixedScale = 0x1p-139f;
inline constexpr float kFp8FixedOffset = bits_float(kFp8FixedBias);
inline constexpr std::uint32_t kFp8HalfStep = 1u << (kFp8FixedFractionBits - 1);
inline constexpr std::uint32_t kF16InvSqrt2Bits = 0x39A8u;  // 0.70703125, fp16 nearest to 2^-1/2
inline constexpr int kF16MantissaBits = 10, kF16Bias = 15;  // IEEE binary16

// Step 1 for one score: the bit pattern of fma(u, 2^-139, offset), saturated
// as I2IP does. `offset` is a float subnormal whose bits are the fixed-point
// bias (kFp8FixedOffset for FP8 P; MXFP4 P moves its block exponent in there).
FP4ATTN_HD inline std::uint32_t fixed_point(float u, float offset) {
  float r;
#if defined(__CUDA_ARCH__)
  asm("fma.rn.f32 %0, %1, %2, %3;" : "=f"(r) : "f"(u), "f"(kFp8FixedScale), "f"(offset));  // no ftz
#else
  r = fmaf(u, kFp8FixedScale, offset);
#endif
  const std::int32_t n = static_cast<std::int32_t>(float_bits(r));
  return n < 0 ? 0u : n > static_cast<std::int32_t>(kFp8FixedMax) ? kFp8FixedMax : static_cast<std::uint32_t>(n);
}

FP4ATTN_HD inline std::uint32_t fp8_fixed_point(float u) { return fixed_point(u, kFp8FixedOffset); }

// Value of a finite, non-negative fp16 bit pattern (the model of the packed
// halves; fp16 is no format of the recipes, so it has no ElemFormat).
FP4ATTN_HD constexpr float f16_value(std::uint32_t bits) {
  const std::uint32_t e = bits >> kF16MantissaBits, m = bits & ((1u << kF16MantissaBits) - 1u);
  if (e == 0) return static_cast<float>(m) * exp2i(1 - kF16Bias - kF16MantissaBits);
  return static_cast<float>(m + (1u << kF16MantissaBits)) * exp2i(static_cast<int>(e) - kF16Bias - kF16MantissaBits);
}

// Bits of a non-negative float v < 65520 rounded to fp16, to nearest even
// (subnormals included): the rounding of HFMA2's result.
FP4ATTN_HD constexpr std::uint32_t f16_bits_rne(float v) {
  constexpr int kFloatMantissaBits = 23, kFloatBias = 127;
  constexpr int kMinNormalExp = 1 - kF16Bias;
  constexpr std::uint32_t kImplicitOne = 1u << kFloatMantissaBits;
  const std::uint32_t bits = float_bits(v);
  const int fe = static_cast<int>(bits >> kFloatMantissaBits) - kFloatBias;
  // Below half the smallest fp16 subnormal (float subnormals included): zero.
  if (fe < kMinNormalExp - kF16MantissaBits - 2) return 0;
  const int te = fe > kMinNormalExp ? fe : kMinNormalExp;
  const int shift = kFloatMantissaBits - kF16MantissaBits + te - fe;  // dropped bits of the 24-bit significand
  const std::uint32_t mant = (bits & (kImplicitOne - 1)) | kImplicitOne;
  std::uint32_t n = mant >> shift;
  const std::uint32_t rem = mant & ((1u << shift) - 1u), half = 1u << (shift - 1);
  if (rem > half || (rem == half && (n & 1u))) ++n;
  // Subnormals land in exponent field 0 and a carry moves into the next binade.
  return (static_cast<std::uint32_t>(te + kF16Bias - 1) << kF16MantissaBits) + n;
}

// Bits of a non-negative float v < 65536 truncated to fp16 (toward zero,
// subnormals included): cvt.rz.f16x2.f32 on one half.
FP4ATTN_HD constexpr std::uint32_t f16_bits_rz(float v) {
  constexpr int kFloatMantissaBits = 23, kFloatBias = 127;
  constexpr int kMinNormalExp = 1 - kF16Bias;
  constexpr std::uint32_t kImplicitOne = 1u << kFloatMantissaBits;
  const std::uint32_t bits = float_bits(v);
  const int fe = static_cast<int>(bits >> kFloatMantissaBits) - kFloatBias;
  if (fe < kMinNormalExp - kF16MantissaBits) return 0;  // below the smallest fp16 subnormal
  const int te = fe > kMinNormalExp ? fe : kMinNormalExp;
  const std::uint32_t mant = (bits & (kImplicitOne - 1)) | kImplicitOne;
  const std::uint32_t n = mant >> (kFloatMantissaBits - kF16MantissaBits + te - fe);
  return (static_cast<std::uint32_t>(te + kF16Bias - 1) << kF16MantissaBits) + n;
}

// Step 2 for one score: v = fp16(x) + 2^-1/2·fp16(x + 2^9), one rounding to
// fp16 as in HFMA2. The fp32 FMA here is exact (both terms are multiples of
// 2^-8 of fp16(x)'s quantum and their sum is below 2^21 such units), so the
// only rounding is the one to fp16.
FP4ATTN_HD inline std::uint32_t fp8_two_phase(std::uint32_t x) {
  return f16_bits_rne(fmaf(f16_value(x + kFp8HalfStep), f16_value(kF16InvSqrt2Bits), f16_value(x)));
}

// FP8 Direct-P of one score (the emulator's entry point; the kernels use
// fp8_codes_x4, which gives the same code for every score).
FP4ATTN_HD inline std::uint8_t fp8_code(float u) {
  return encode_rne_sat(ElemFormat::e4m3, f16_value(fp8_two_phase(fp8_fixed_point(u))));
}

#if defined(__CUDACC__)
namespace device {
// Steps 1 and 2 for two scores, packed as f16x2 (lo in bits 0..15): 2 FFMA,
// I2IP, VIADD.16x2, HFMA2.
__device__ inline std::uint32_t curve_pair(float lo, float hi, float offset) {
  constexpr std::uint32_t kHalfSteps = kFp8HalfStep | (kFp8HalfStep << 16);
  constexpr std::uint32_t kWeights = kF16InvSqrt2Bits | (kF16InvSqrt2Bits << 16);
  float r_lo, r_hi;
  std::uint32_t x, shifted, v;
  asm("fma.rn.f32 %0, %1, %2, %3;" : "=f"(r_lo) : "f"(lo), "f"(kFp8FixedScale), "f"(offset));
  asm("fma.rn.f32 %0, %1, %2, %3;" : "=f"(r_hi) : "f"(hi), "f"(kFp8FixedScale), "f"(offset));
  asm("cvt.pack.sat.u16.s32 %0, %1, %2;" : "=r"(x) : "r"(float_bits(r_hi)), "r"(float_bits(r_lo)));  // hi in bits 16..31
  asm("add.u16x2 %0, %1, %2;" : "=r"(shifted) : "r"(x), "r"(kHalfSteps));  // per half: no carry between scores
  asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(v) : "r"(shifted), "r"(kWeights), "r"(x));
  return v;
}

// Two f16x2 words rounded to four E4M3 codes, lo01 → byte 0.
__device__ inline std::uint32_t e4m3x4_of_f16x2(std::uint32_t v01, std::uint32_t v23) {
  std::uint32_t codes;
  asm("{\n .reg .b16 lo, hi;\n cvt.rn.satfinite.e4m3x2.f16x2 lo, %1;\n cvt.rn.satfinite.e4m3x2.f16x2 hi, %2;\n"
      " mov.b32 %0, {lo, hi};\n}"
      : "=r"(codes)
      : "r"(v01), "r"(v23));
  return codes;
}
}  // namespace device
#endif

// FP8 Direct-P of four scores, the codes of u0 .. u3 in bytes 0 .. 3 (the order
// of an FP8 wgmma A-operand register). GPU: 4 FFMA, 2 I2IP, 2 VIADD.16x2,
// 2 HFMA2, 2 F2FP; the second F2FP merges the halves.
FP4ATTN_HD inline std::uint32_t fp8_codes_x4(float u0, float u1, float u2, float u3) {
#if defined(__CUDA_ARCH__)
  return device::e4m3x4_of_f16x2(device::curve_pair(u0, u1, kFp8FixedOffset),
                                 device::curve_pair(u2, u3, kFp8FixedOffset));
#else
  return fp8_code(u0) | (static_cast<std::uint32_t>(fp8_code(u1)) << 8) |
         (static_cast<std::uint32_t>(fp8_code(u2)) << 16) | (static_cast<std::uint32_t>(fp8_code(u3)) << 24);
#endif
}

// FP8 P on sm90 shares the scores of every 128-key tile between two pipes
// (DESIGN §3.3, "splitting scores between MUFU and the FMA pipe"): the
// kernels' softmax is bound by the issue of FMA- and ALU-pipe instructions
// while the MUFU pipe idles (src/cuda/sm90/fwd/fp8_direct_p/NOTES.md). Keys
// whose index modulo kSm90Fp8Tile is at least kSm90Fp8MufuFirstKey take the
// E4M3 code of ex2.approx(x), x = s·c − (m − 8) (one FFMA, one MUFU, half an
// F2FP per score, against four issue slots for the curve above); the others
// take fp8_codes_x4. ex2.approx is within two float steps of 2^x, so its
// round-to-nearest code keeps the contract (the emulator's sm90 target stores
// the hardware's result near every E4M3 boundary: emulator/ex2_sm90.hpp).
// The share, 48 of 128 keys, is the fastest measured on the H200 (docs/perf-log.md, v10:
// 16, 32 and 48 keys gain 3 to 11 % over none; 64 and more gain less, 96 loses).
inline constexpr int kSm90Fp8Tile = 128;
inline constexpr int kSm90Fp8MufuFirstKey = 80;
static_assert(kSm90Fp8MufuFirstKey % 16 == 0 && kSm90Fp8MufuFirstKey >= 0 && kSm90Fp8MufuFirstKey <= kSm90Fp8Tile,
              "the split runs along the 16-key halves of the P·V product's k32 steps");

FP4ATTN_HD constexpr bool sm90_fp8_key_on_mufu(std::int64_t key) { return key % kSm90Fp8Tile >= kSm90Fp8MufuFirstKey; }

// Σ of the four E4M3 values packed in a word: the row sum l adds what P·V
// used. Exact in fp32 in any order: E4M3 values ≥ 2^-9 are multiples of 2^-9
// below 2^9, so any sum of up to 128 of them has at most 24 significant bits.
// GPU: 2 F2FP (e4m3x2 → f16x2, exact), 4 conversions to fp32, 3 FADD; on the
// H200 that beats decoding each code with a shift and a multiply
// (dev/direct_p_throughput, v1 with the row sum).
FP4ATTN_HD inline float fp8_decoded_sum_x4(std::uint32_t codes) {
#if defined(__CUDA_ARCH__)
  float p0, p1, p2, p3;
  asm("{\n .reg .b16 c01, c23, h0, h1, h2, h3;\n .reg .b32 h01, h23;\n mov.b32 {c01, c23}, %4;\n"
      " cvt.rn.f16x2.e4m3x2 h01, c01;\n cvt.rn.f16x2.e4m3x2 h23, c23;\n"
      " mov.b32 {h0, h1}, h01;\n mov.b32 {h2, h3}, h23;\n"
      " cvt.f32.f16 %0, h0;\n cvt.f32.f16 %1, h1;\n cvt.f32.f16 %2, h2;\n cvt.f32.f16 %3, h3;\n}"
      : "=f"(p0), "=f"(p1), "=f"(p2), "=f"(p3)
      : "r"(codes));
  return (p0 + p1) + (p2 + p3);
#else
  const auto value = [codes](int b) { return decode(ElemFormat::e4m3, (codes >> (8 * b)) & 0xFFu); };
  return (value(0) + value(1)) + (value(2) + value(3));
#endif
}

// The round-to-nearest baseline (Direct-P off) depends on the exp2 unit, so
// it is target-aware and lives in the emulator: emulator::fp8_code_exp2
// (src/emulator/ex2_sm90.hpp), which models the H200's ex2.approx.

// ---- FP4 P -----------------------------------------------------------------
// log2 of the E2M1 rounding boundaries 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5:
// exact round-to-nearest gives code k where v = u − E has crossed k of them;
// the curves of mxfp4_code and nvfp4_code place their code changes within
// the contract's 1 % of these (tests/test_direct_p.cpp).
inline constexpr float kE2M1Log2Bounds[7] = {
    -2.0f, -0.415037499278843818f, 0.321928094887362348f, 0.807354922057604107f,
    1.321928094887362348f, 1.807354922057604107f, 2.321928094887362348f};
inline constexpr float kLog2Of6 = 2.584962500721156181f;
inline constexpr int kNoBlockExponent = -127;  // block that holds only masked scores

// MXFP4 P block exponent: E = ceil(u_max − log2 6), so the block maximum 2^u_max
// maps to (3, 6] and is never clipped. Clamped to E8M0's range.
// GPU: one FADD, cvt.rpi (saturating by definition: −inf, a block of masked scores, gives
// INT_MIN) and the clamp; the host gets the same from the clamp in float.
// (NaN is not a score.)
FP4ATTN_HD inline int mx_block_exponent(float u_max) {
#if defined(__CUDA_ARCH__)
  int e;
  asm("cvt.rpi.s32.f32 %0, %1;" : "=r"(e) : "f"(u_max - kLog2Of6));
  return e < kNoBlockExponent ? kNoBlockExponent : e;
#else
  const float e = ceilf(u_max - kLog2Of6);
  return e > static_cast<float>(kNoBlockExponent) ? static_cast<int>(e) : kNoBlockExponent;
#endif
}

// MXFP4 P element code: the E2M1 rounding of 2^(u − E), by the FP8 sequence's
// curve instead of seven threshold compares (DESIGN §3.3 contract; measured
// in tests/test_direct_p.cpp):
//
//  1. x = round(2^10·(u − E)) + kMxfp4FixedBias, the FP8 fixed point with E
//     moved into the FFMA's addend (bits kMxfp4FixedBias − 2^10·E): E costs
//     one addend per block, not an instruction per score.
//  2. v = the two-phase curve of x (fp8_two_phase): v ≈ 2^(u − E) · 2^-10,
//     normal in fp16 for every u − E above −2.95, so the curve is exponential
//     across all seven boundaries.
//  3. v · 2^-4 (HMUL2, one rounding) puts E2M1's value q at q · 2^-14. There
//     E2M1's eight values are exactly the fp16 patterns c · 2^9, c = 0 .. 7
//     (0.5 is the subnormal 0x200, 1 the smallest normal 0x400, …, 6 is
//     0x0E00), and within fp16's first binades the pattern is linear in the
//     value, so rounding the pattern at bit 9 is rounding to E2M1:
//  4. code = (bits + 2^8) >> 9 (a tie rounds up; the boundary error below
//     counts it).
//
// Where the code changes, u − E misses the exact log2 boundary by at most
// 0.56 % in 2^(u − E) (bias 4038 minimises the worst of the seven; the
// 0.25 boundary falls in fp16's subnormals, where step 3 rounds to 2^-24),
// inside the contract's 1 %. u − E ≤ log2 6 (E from a maximum ≥ u) keeps the
// code ≤ 7; the host clamps anyway.
inline constexpr std::uint32_t kMxfp4FixedBias = 4038;
inline constexpr std::uint32_t kF16TwoPowMinus4Bits = 0x2C00u;  // 2^-4
inline constexpr std::uint32_t kE2M1CodeShift = 9;             // q·2^-14 has its code at fp16 bit 9 up
inline constexpr std::uint32_t kE2M1CodeRound = 1u << (kE2M1CodeShift - 1);
inline constexpr std::uint32_t kE2M1MaxCode = 7;

// The FFMA addend of step 1 for block exponent E (kNoBlockExponent ≤ E ≤ 3):
// a float subnormal whose bits are kMxfp4FixedBias − 2^10·E.
FP4ATTN_HD inline float mxfp4_fixed_offset(int block_exp) {
  return bits_float(static_cast<std::uint32_t>(static_cast<std::int32_t>(kMxfp4FixedBias) - 1024 * block_exp));
}

// Steps 2 to 4 for one fixed-point x: fp16 bits of q·2^-14 before the code is
// cut out, i.e. what the GPU holds after its round-up add.
FP4ATTN_HD inline std::uint32_t mxfp4_rounded_bits(std::uint32_t x) {
  const std::uint32_t v = fp8_two_phase(x);
  return f16_bits_rne(f16_value(v) * f16_value(kF16TwoPowMinus4Bits)) + kE2M1CodeRound;
}

FP4ATTN_HD inline std::uint8_t mxfp4_code(float u, int block_exp) {
  const std::uint32_t code = mxfp4_rounded_bits(fixed_point(u, mxfp4_fixed_offset(block_exp))) >> kE2M1CodeShift;
  return static_cast<std::uint8_t>(code < kE2M1MaxCode ? code : kE2M1MaxCode);
}

// MXFP4 P on MUFU: sm90's share of the keys, as FP8 P has one (the kernels'
// softmax is bound by FMA- and ALU-pipe issue while MUFU has room). For keys
// whose index modulo kSm90Fp8Tile is at least kSm90Mxfp4MufuFirstKey the
// E2M1 code of 2^(u − E) comes from p = ex2.approx(x), x = s·c − (m + E + 14)
// (one FFMA; m + E + 14 once per block): p ≈ 2^(u − E)·2^-14 is truncated to
// fp16 (cvt.rz), where E2M1's values are the patterns c·2^9 (mxfp4_code,
// step 3), and the round-up add at bit 9 gives the code. The code changes
// exactly where p crosses an E2M1 midpoint times 2^-14 (a tie rounds up):
// exact rounding of the hardware's exp2, which is within 2 float steps of 2^x
// (the emulator's sm90 target stores its result near every such point,
// emulator/ex2_sm90.hpp). Per pair 2 FFMA, 2 MUFU and one conversion against
// the curve's 2 FFMA for u, 2 FFMA, I2IP, VIADD.16x2, HFMA2 and HMUL2.
// Keys 48 .. 127 of each tile. With the fold by two HMUL2 and F2FP, 48 and 64
// keys measured +2 %, 80 −1 % and 32 −1 % against none (docs/perf-log.md,
// mx7); with the fold by table (mx8), 80 keys +3 % against 48, 96 −1 %
// (mx8b).
inline constexpr int kSm90Mxfp4MufuFirstKey = 48;
inline constexpr int kMxfp4MufuExponentShift = 14;  // p carries 2^-14: E2M1 onto fp16's linear grid
static_assert(kSm90Mxfp4MufuFirstKey % 16 == 0 && kSm90Mxfp4MufuFirstKey >= 0 &&
                  kSm90Mxfp4MufuFirstKey <= kSm90Fp8Tile,
              "the split runs along the 16-key halves of the P·V product's k32 steps");

FP4ATTN_HD constexpr bool sm90_mxfp4_key_on_mufu(std::int64_t key) {
  return key % kSm90Fp8Tile >= kSm90Mxfp4MufuFirstKey;
}

// What x subtracts from s·c for a block of exponent E: m + (E + 14), one float add.
FP4ATTN_HD inline float mxfp4_mufu_shift(float m, int block_exp) {
  return m + static_cast<float>(block_exp + kMxfp4MufuExponentShift);
}

// The E2M1 code from p = ex2.approx(x) (the host model's value of it).
FP4ATTN_HD inline std::uint8_t mxfp4_code_of_mufu(float p) {
  const std::uint32_t code = (f16_bits_rz(p) + kE2M1CodeRound) >> kE2M1CodeShift;
  return static_cast<std::uint8_t>(code < kE2M1MaxCode ? code : kE2M1MaxCode);
}

#if defined(__CUDACC__)
namespace device {
// MXFP4 P's codes of two elements as fp16 patterns on E2M1's grid: c·2^9 in
// each half (c = 0 .. 7, the code; bits 0 .. 8 and 12 .. 15 zero), from two
// fp16 halves of q·2^-14 before rounding: the round-up add at bit 9 and a
// mask.
__device__ inline std::uint32_t e2m1_pattern_pair(std::uint32_t sub) {
  constexpr std::uint32_t kRoundUp = kE2M1CodeRound | (kE2M1CodeRound << 16);
  constexpr std::uint32_t kValueMask = ~((kE2M1CodeRound << 1) - 1u) & 0xFFFFu;
  // Both halves stay below 0x0F0D + 2^8: the add never carries into the high half.
  return (sub + kRoundUp) & (kValueMask | (kValueMask << 16));
}

// The pair by the curve (mxfp4_code): `offset` = mxfp4_fixed_offset(E); the
// curve, then HMUL2 by 2^-4 onto fp16's grid where E2M1's values are c·2^9.
__device__ inline std::uint32_t mxfp4_pattern_pair(float lo, float hi, float offset) {
  constexpr std::uint32_t kScaleDown = kF16TwoPowMinus4Bits | (kF16TwoPowMinus4Bits << 16);
  std::uint32_t sub;
  asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(sub) : "r"(curve_pair(lo, hi, offset)), "r"(kScaleDown));
  return e2m1_pattern_pair(sub);
}

// The pair on MUFU (sm90_mxfp4_key_on_mufu): x = s·c − mxfp4_mufu_shift(m, E),
// ex2.approx, truncated to fp16 (mxfp4_code_of_mufu).
__device__ inline std::uint32_t mxfp4_pattern_pair_mufu(float x_lo, float x_hi) {
  float p_lo, p_hi;
  std::uint32_t sub;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(p_lo) : "f"(x_lo));
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(p_hi) : "f"(x_hi));
  asm("cvt.rz.f16x2.f32 %0, %1, %2;" : "=r"(sub) : "f"(p_hi), "f"(p_lo));  // first source → high half
  return e2m1_pattern_pair(sub);
}

// Four codes (a: elements 0, 1; b: elements 2, 3, as e2m1_pattern_pair
// leaves them) to their folded E4M3 bytes, element 0 in byte 0, through the
// block's table (byte q of lo:hi is the byte of magnitude q): the codes are
// gathered into the four selector nibbles of one byte permute. a >> 9 puts
// code 0 at bit 0 and code 1 at bit 16, b >> 1 code 2 at bit 8 and code 3 at
// bit 24 (the patterns are zero elsewhere, so the add is an or); w + (w >> 12)
// moves codes 1 and 3 to bits 4 and 12. Selector bit 3 of every nibble stays
// 0 (codes ≤ 7): plain byte copies.
__device__ inline std::uint32_t e4m3x4_of_e2m1_patterns(std::uint32_t a, std::uint32_t b, std::uint32_t table_lo,
                                                        std::uint32_t table_hi) {
  const std::uint32_t w = (a >> kE2M1CodeShift) + (b >> (kE2M1CodeShift - 8));
  std::uint32_t bytes;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(bytes) : "r"(table_lo), "r"(table_hi), "r"(w + (w >> 12)));
  return bytes;
}
}  // namespace device
#endif

// NVFP4 P block scale: UE4M3 code of 2^(u_max + 8) / 6 (0 for a fully masked
// block). The element value is q·s_b·2^-8.
FP4ATTN_HD inline std::uint8_t nvfp4_block_scale(float u_max) {
  constexpr float kInv6 = 1.0f / 6.0f;
  if (!(u_max > -1e30f)) return 0;
  return encode_rne_sat(ElemFormat::ue4m3, exp2_poly(u_max + kNvfp4Offset) * kInv6);
}

// log2 of a finite UE4M3 value (exact to float precision); -inf for the zero
// scale of an all-underflow block, whose codes then all compare to 0.
FP4ATTN_HD inline float log2_of_ue4m3(std::uint8_t code) {
  constexpr float kLog2OnePlusEighths[8] = {0.0f, 0.169925001442312f, 0.321928094887362f, 0.459431618637297f,
                                            0.584962500721156f, 0.700439718141092f, 0.807354922057604f,
                                            0.906890595608519f};
  const int ef = (code >> 3) & 0xF;
  const int m = code & 7;
  if (ef == 0 && m == 0) return -bits_float(0x7F800000u);
  if (ef == 0) return static_cast<float>(floor_log2(static_cast<float>(m))) - 9.0f +
                      kLog2OnePlusEighths[(m << (3 - floor_log2(static_cast<float>(m)))) & 7];
  return static_cast<float>(ef - 7) + kLog2OnePlusEighths[m];
}

// NVFP4 P element code: the E2M1 rounding of 2^w, w = u + 8 − log2 s_b, by
// MXFP4 P's curve (mxfp4_code) instead of seven threshold compares (DESIGN
// §3.3 contract; measured in tests/test_direct_p.cpp):
//
//  1. x = round(2^10·u + kNvfp4FixedBias + round(2^10·(8 − log2 s_b))): the
//     block's scale goes into the FFMA's addend, as MXFP4's block exponent
//     does. s_b is a UE4M3 value, not a power of two, so 2^10·(8 − log2 s_b)
//     is rounded to an integer once per block (nvfp4_fixed_offset): that moves
//     w by at most 2^-11, 0.034 % in 2^w, on top of MXFP4's boundary error.
//  2. The two-phase fp16 curve, HMUL2 by 2^-4 onto fp16's subnormal grid and
//     the round-up add at bit 9, exactly as mxfp4_rounded_bits; in between, a
//     min with 6·2^-14 (HMNMX2, the pattern 0x0E00): with a subnormal UE4M3
//     scale the block maximum can reach w = log2 9 (s_b rounds 2^(u_max + 8)/6
//     down by up to a third), where the pattern would round to a code 8.
//     Normal scales keep w below log2(6 · 1.07), where the pattern rounds to
//     7 with or without the min.
//
// Where the code changes, w misses the exact log2 boundary by at most 0.53 %
// in 2^w over every UE4M3 scale (tests/test_direct_p.cpp,
// Nvfp4CurveBoundariesEveryScale), inside the contract's 1 %. The bias is
// MXFP4's less one unit: 4037 minimises the worst of the seven boundaries
// over all 126 finite scales (0.53 %; 4038 gives 0.59 %, 4036 0.60 %), since
// step 1's rounding of log2 s_b shifts each scale's boundaries by its own
// fraction of a unit.
// Precondition: w < 26 (x + 2^9 stays below fp16's infinity); with u ≤ 1 and
// a finite scale ≥ 2^-9, w ≤ 18.
inline constexpr std::uint32_t kNvfp4FixedBias = 4037;
inline constexpr std::uint32_t kE2M1MaxValueBits = 0x0E00u;  // 6 · 2^-14 as fp16: code 7 after the round-up add

// The FFMA addend of step 1: a float subnormal whose bits are kNvfp4FixedBias
// + round(2^10·(8 − log2 s_b)). One FFMA and one magic add, rounding to
// nearest even on both host and device. A zero scale (log2 −inf) gets offset
// 0, whose x is 0 for every u ≤ 0 (code 0, as nvfp4_code's early return).
FP4ATTN_HD inline float nvfp4_fixed_offset(float log2_block_scale) {
  constexpr float kUnitsPerLog2 = 1 << kFp8FixedFractionBits;
  if (!(log2_block_scale > -1e30f)) return 0.0f;
  const float units = fmaf(-log2_block_scale, kUnitsPerLog2, kNvfp4Offset * kUnitsPerLog2 + kNvfp4FixedBias);
  return bits_float(float_bits(units + kRoundMagic) - float_bits(kRoundMagic));
}

// Step 2 for one fixed-point x: fp16 bits of q·2^-14 before the code is cut
// out (what the GPU holds after its round-up add; code = bits >> 9 ≤ 7).
FP4ATTN_HD inline std::uint32_t nvfp4_rounded_bits(std::uint32_t x) {
  const std::uint32_t sub = f16_bits_rne(f16_value(fp8_two_phase(x)) * f16_value(kF16TwoPowMinus4Bits));
  // Non-negative fp16 values order as their bit patterns: HMNMX2 is this min.
  return (sub < kE2M1MaxValueBits ? sub : kE2M1MaxValueBits) + kE2M1CodeRound;
}

// A zero block scale (log2 = −inf) gives code 0: the block underflowed.
FP4ATTN_HD inline std::uint8_t nvfp4_code(float u, float log2_block_scale) {
  if (!(log2_block_scale > -1e30f)) return 0;
  return static_cast<std::uint8_t>(nvfp4_rounded_bits(fixed_point(u, nvfp4_fixed_offset(log2_block_scale))) >>
                                   kE2M1CodeShift);
}

// The BF16 operand of the P·V product from the fp16 pattern c·2^9 of q·2^-14
// (the round-up add's result, masked to bits 9..15), as the GPU builds it
// (device::nvfp4_bf16_pair), modelled on one half: >> 3 gives c·2^6, the bf16
// pattern of q·2^-126 (E2M1's code bits are the top bits of both formats'
// subnormal grids: 0.5 is the bf16 subnormal 0x0040, 1 the smallest normal
// 0x0080, 6 is 0x01C0), then one bf16 multiply by s_b·2^118, exact (q·s_b has
// at most 6 significant bits, bf16 8). The operand is thus P·2^-8 = q·s_b·2^-8:
// s_b·2^126 would overflow bf16 for s_b ≥ 4, s_b·2^118 ≤ 448·2^118 does not,
// and the kernel takes 2^8 back once, in the epilogue's O factor (a power of
// two: O/l rounds as it would without it). q·s_b·2^-8 ≥ 2^-18 stays normal.
inline constexpr int kNvfp4Bf16ScaleExp = 118;    // 126 (bf16 pattern c·2^6 is q·2^-126) − 8
inline constexpr float kNvfp4OperandUnscale = 256.0f;  // 2^(126 − kNvfp4Bf16ScaleExp): the epilogue's factor
inline constexpr std::uint32_t kF16ToBf16Shift = 3;   // c·2^9 → c·2^6: E2M1 code bits below fp16's / bf16's exponent

// Bits of the bf16 value q·s_b·2^-8 for the masked fp16 pattern q_bits (one
// half of the pair) and the float s_b·2^118 (exact, the kernel's table entry).
FP4ATTN_HD inline std::uint32_t nvfp4_bf16_value_bits(std::uint32_t q_bits, float scale_2pow118) {
  const float q_bf16 = bits_float((q_bits >> kF16ToBf16Shift) << 16);  // a float subnormal for code 1, as in bf16
  const float product = q_bf16 * bits_float(float_bits(scale_2pow118) & 0xFFFF0000u);
  return float_bits(product) >> 16;  // exact, so no rounding to bf16 is needed
}

#if defined(__CUDACC__)
namespace device {
// Steps 1 and 2 of nvfp4_code for two scores of one block (lo in bits 0..15):
// the fp16 patterns of q·2^-14, c·2^9 for E2M1 code c. `offset` =
// nvfp4_fixed_offset(log2 s_b). After the curve: HMUL2, HMNMX2, the round-up
// add and the mask: 6 instructions per pair beyond curve_pair's 5.
__device__ inline std::uint32_t nvfp4_q_pair(float lo, float hi, float offset) {
  constexpr std::uint32_t kScaleDown = kF16TwoPowMinus4Bits | (kF16TwoPowMinus4Bits << 16);
  constexpr std::uint32_t kMaxValue = kE2M1MaxValueBits | (kE2M1MaxValueBits << 16);
  constexpr std::uint32_t kRoundUp = kE2M1CodeRound | (kE2M1CodeRound << 16);
  constexpr std::uint32_t kValueMask = ~((kE2M1CodeRound << 1) - 1u) & 0xFFFFu;
  std::uint32_t sub;
  asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(sub) : "r"(curve_pair(lo, hi, offset)), "r"(kScaleDown));
  asm("min.f16x2 %0, %1, %2;" : "=r"(sub) : "r"(sub), "r"(kMaxValue));
  // Both halves stay at most 0x0F00 after the add: no carry into the high half.
  return (sub + kRoundUp) & (kValueMask | (kValueMask << 16));
}

// nvfp4_bf16_value_bits for both halves of nvfp4_q_pair's result: one shift
// of the whole word (the high half's bits 16..18 are masked to 0, so nothing
// leaks into the low half) and HMUL2.BF16, which keeps the subnormal
// pattern of code 1 (bf16 arithmetic has no flush-to-zero; the GPU test
// GpuNvfp4PHelpers.ValuesAreCodeTimesScale checks every code and scale).
// `scale` = bf16x2 of s_b·2^118.
__device__ inline std::uint32_t nvfp4_bf16_pair(std::uint32_t q, std::uint32_t scale) {
  std::uint32_t v;
  asm("mul.rn.bf16x2 %0, %1, %2;" : "=r"(v) : "r"(q >> kF16ToBf16Shift), "r"(scale));
  return v;
}
}  // namespace device
#endif

}  // namespace fp4attn::direct_p
