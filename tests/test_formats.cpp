// Element codecs (DESIGN §3.1): every code of every format, every rounding tie,
// saturation, subnormals and FP4 packing, checked against the formats' written
// definitions and two independent oracles: ml_dtypes vectors
// (scripts/gen_oracle_vectors.py) and, when the CUDA headers are available, the
// host conversion functions of cuda_fp8.h / cuda_fp4.h.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <iostream>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "fp4attn/error.hpp"
#include "fp4attn/formats.hpp"
#include "fp4attn/quantize.hpp"
#include "oracle_vectors.hpp"

#if defined(FP4ATTN_HAVE_CUDA_HEADERS)
#include <cuda_fp16.h>
#include <cuda_fp4.h>
#include <cuda_fp8.h>
#endif

namespace fp4attn {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kFloatMax = std::numeric_limits<float>::max();
constexpr ElemFormat kElementFormats[] = {ElemFormat::e2m1, ElemFormat::e4m3, ElemFormat::e5m2, ElemFormat::ue4m3};

std::string name_of(ElemFormat f) {
  switch (f) {
    case ElemFormat::e2m1: return "e2m1";
    case ElemFormat::e4m3: return "e4m3";
    case ElemFormat::e5m2: return "e5m2";
    case ElemFormat::ue4m3: return "ue4m3";
  }
  return "?";
}

bool has_sign(ElemFormat f) { return f != ElemFormat::ue4m3; }
std::uint32_t sign_bit(ElemFormat f) { return has_sign(f) ? 1u << (code_bits(f) - 1) : 0u; }
std::uint32_t max_code(ElemFormat f) { return spec_of(f).max_code; }
bool same_float(float a, float b) { return (std::isnan(a) && std::isnan(b)) || float_bits(a) == float_bits(b); }

// The formats as their specifications write them, independent of spec_of():
// value = (-1)^s · 2^(e - bias) · (1 + m / 2^M), subnormal 2^(1 - bias) · m / 2^M.
struct Textbook {
  int exp_bits, man_bits, bias;
};
Textbook textbook(ElemFormat f) {
  switch (f) {
    case ElemFormat::e2m1: return {2, 1, 1};
    case ElemFormat::e4m3: return {4, 3, 7};
    case ElemFormat::e5m2: return {5, 2, 15};
    case ElemFormat::ue4m3: return {4, 3, 7};
  }
  return {0, 0, 0};
}

double textbook_value(ElemFormat f, std::uint32_t code) {
  const Textbook t = textbook(f);
  const std::uint32_t mag = has_sign(f) ? code & (sign_bit(f) - 1u) : code;
  const int e = static_cast<int>(mag >> t.man_bits);
  const int m = static_cast<int>(mag & ((1u << t.man_bits) - 1u));
  const int exp_all_ones = (1 << t.exp_bits) - 1;
  double v = 0;
  if (f == ElemFormat::e5m2 && e == exp_all_ones) {
    v = m == 0 ? std::numeric_limits<double>::infinity() : std::numeric_limits<double>::quiet_NaN();
  } else if ((f == ElemFormat::e4m3 || f == ElemFormat::ue4m3) && e == exp_all_ones && m == (1 << t.man_bits) - 1) {
    v = std::numeric_limits<double>::quiet_NaN();  // E4M3 "fn": S.1111.111 is NaN, no Inf
  } else if (e == 0) {
    v = std::ldexp(m, 1 - t.bias - t.man_bits);
  } else {
    v = std::ldexp(m + (1 << t.man_bits), e - t.bias - t.man_bits);
  }
  return (code & sign_bit(f)) ? -v : v;
}

TEST(Formats, E2M1ValuesAreTheDesignTable) {
  const float kTable[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  for (std::uint32_t c = 0; c < 8; ++c) {
    EXPECT_EQ(decode(ElemFormat::e2m1, c), kTable[c]) << c;
    EXPECT_EQ(decode(ElemFormat::e2m1, c | 8u), -kTable[c]) << c;
  }
  EXPECT_TRUE(std::signbit(decode(ElemFormat::e2m1, 8u)));  // code 8 is -0
}

TEST(Formats, DecodeMatchesTheTextbookFormulaForEveryCode) {
  for (ElemFormat f : kElementFormats)
    for (int c = 0; c < code_count(f); ++c)
      EXPECT_TRUE(same_float(decode(f, c), static_cast<float>(textbook_value(f, c)))) << name_of(f) << " code " << c;
}

TEST(Formats, LargestFiniteValues) {
  EXPECT_EQ(decode(ElemFormat::e2m1, max_code(ElemFormat::e2m1)), kE2M1Max);
  EXPECT_EQ(decode(ElemFormat::e4m3, max_code(ElemFormat::e4m3)), kE4M3Max);
  EXPECT_EQ(decode(ElemFormat::ue4m3, max_code(ElemFormat::ue4m3)), kE4M3Max);
  EXPECT_EQ(decode(ElemFormat::e5m2, max_code(ElemFormat::e5m2)), kE5M2Max);
}

// Conventions: a NaN code re-encodes to the format's one canonical NaN code
// (E5M2 has six NaN codes, positive and negative); E5M2 ±Inf re-encodes to
// ±max because encoding saturates (satfinite). Every other code, -0 included,
// comes back as itself.
TEST(Formats, EveryCodeRoundTrips) {
  for (ElemFormat f : kElementFormats)
    for (int c = 0; c < code_count(f); ++c) {
      const float v = decode(f, c);
      std::uint32_t expected = static_cast<std::uint32_t>(c);
      if (std::isnan(v)) expected = nan_code(f);
      if (std::isinf(v)) expected = (c & sign_bit(f)) | max_code(f);
      EXPECT_EQ(encode_rne_sat(f, v), expected) << name_of(f) << " code " << c << " value " << v;
    }
}

TEST(Formats, E8M0EveryCodeRoundTrips) {
  for (int c = 0; c < kE8M0Nan; ++c) {
    const int k = c - kE8M0Bias;
    const float v = decode_e8m0(static_cast<std::uint8_t>(c));
    EXPECT_EQ(v, static_cast<float>(std::ldexp(1.0, k))) << c;  // 2^-127 is a float subnormal
    EXPECT_EQ(floor_log2(v), k) << c;
    EXPECT_EQ(ceil_log2(v), k) << c;
    // Encoding through the MX scale rules: 4·2^k under the OCP floor rule and
    // 6·2^k under the round-up rule both give scale 2^k exactly.
    if (k + 2 <= std::numeric_limits<float>::max_exponent - 1) {
      EXPECT_EQ(mx_scale_code(4.0f * v, MxScaleRule::ocp_floor), c) << c;
      EXPECT_EQ(mx_scale_code(6.0f * v, MxScaleRule::round_up), c) << c;
    }
  }
  EXPECT_TRUE(std::isnan(decode_e8m0(kE8M0Nan)));
}

TEST(Formats, FloorAndCeilLog2CoverFloatSubnormals) {
  EXPECT_EQ(floor_log2(std::numeric_limits<float>::denorm_min()), -149);
  EXPECT_EQ(ceil_log2(std::numeric_limits<float>::denorm_min()), -149);
  EXPECT_EQ(floor_log2(3.0f * std::numeric_limits<float>::denorm_min()), -148);
  EXPECT_EQ(ceil_log2(3.0f * std::numeric_limits<float>::denorm_min()), -147);
  EXPECT_EQ(floor_log2(-std::numeric_limits<float>::min()), -126);
  EXPECT_EQ(floor_log2(std::nextafter(std::numeric_limits<float>::min(), 0.0f)), -127);
  EXPECT_EQ(floor_log2(kFloatMax), 127);
  EXPECT_EQ(ceil_log2(kFloatMax), 128);
}

// The value halfway between two adjacent codes goes to the code with an even
// mantissa (its last bit 0); anything off the midpoint goes to the nearer code.
TEST(Formats, EveryTieGoesToTheEvenCode) {
  for (ElemFormat f : kElementFormats)
    for (std::uint32_t c = 0; c < max_code(f); ++c) {
      const double lo = decode(f, c), hi = decode(f, c + 1);
      const float mid = static_cast<float>((lo + hi) / 2);  // exact: the codes differ in one low bit
      ASSERT_EQ(static_cast<double>(mid), (lo + hi) / 2);
      const std::uint32_t even = (c % 2 == 0) ? c : c + 1;
      for (float sign : {1.0f, -1.0f}) {
        const std::uint32_t s = sign < 0 ? sign_bit(f) : 0u;
        SCOPED_TRACE(name_of(f) + " between codes " + std::to_string(c) + " and " + std::to_string(c + 1) +
                     (sign < 0 ? " (negative)" : ""));
        EXPECT_EQ(encode_rne_sat(f, sign * mid), s | even);
        EXPECT_EQ(encode_rne_sat(f, sign * std::nextafter(mid, 0.0f)), s | c);
        EXPECT_EQ(encode_rne_sat(f, sign * std::nextafter(mid, kInf)), s | (c + 1));
      }
    }
}

TEST(Formats, SaturatesToTheLargestFiniteValue) {
  for (ElemFormat f : kElementFormats) {
    SCOPED_TRACE(name_of(f));
    const float max_value = decode(f, max_code(f));
    const float step = max_value - decode(f, max_code(f) - 1);
    // Up to and including the tie with the next (nonexistent) code, RNE itself
    // gives max; beyond it, only saturation does.
    for (float x : {max_value + step / 2, max_value + step, 2 * max_value, kFloatMax, kInf}) {
      EXPECT_EQ(encode_rne_sat(f, x), max_code(f)) << x;
      EXPECT_EQ(encode_rne_sat(f, -x), sign_bit(f) | max_code(f)) << -x;
    }
    EXPECT_EQ(encode_rne_sat(f, kNaN), nan_code(f));
    EXPECT_EQ(encode_rne_sat(f, -kNaN), nan_code(f));
  }
  // E2M1 has no NaN: nan_code is an impossible code, so a NaN can never pass as a number.
  EXPECT_GE(nan_code(ElemFormat::e2m1), code_count(ElemFormat::e2m1));
}

TEST(Formats, SubnormalCodes) {
  EXPECT_EQ(decode(ElemFormat::e4m3, 1), std::ldexp(1.0f, -9));
  EXPECT_EQ(decode(ElemFormat::e4m3, 7), 0.875f * std::ldexp(1.0f, -6));  // largest subnormal
  EXPECT_EQ(decode(ElemFormat::e4m3, 8), std::ldexp(1.0f, -6));           // smallest normal
  EXPECT_EQ(decode(ElemFormat::e5m2, 1), std::ldexp(1.0f, -16));
  EXPECT_EQ(decode(ElemFormat::e5m2, 4), std::ldexp(1.0f, -14));
  EXPECT_EQ(decode(ElemFormat::e2m1, 1), 0.5f);
  for (ElemFormat f : kElementFormats) {
    SCOPED_TRACE(name_of(f));
    const float smallest = decode(f, 1);
    EXPECT_EQ(encode_rne_sat(f, smallest / 2), 0u);  // tie with zero: zero is even
    EXPECT_EQ(encode_rne_sat(f, std::nextafter(smallest / 2, kInf)), 1u);
    EXPECT_EQ(encode_rne_sat(f, smallest / 4), 0u);
    // Float subnormals are far below every format's smallest step; the sign survives.
    for (float tiny : {std::numeric_limits<float>::denorm_min(), 1e-40f}) {
      EXPECT_EQ(encode_rne_sat(f, tiny), 0u);
      EXPECT_EQ(encode_rne_sat(f, -tiny), sign_bit(f));
    }
    EXPECT_EQ(encode_rne_sat(f, -0.0f), sign_bit(f));
  }
}

TEST(Formats, UnsignedE4M3TakesMagnitudeAndMatchesE4M3) {
  for (int c = 0; c < code_count(ElemFormat::ue4m3); ++c)
    EXPECT_TRUE(same_float(decode(ElemFormat::ue4m3, c), decode(ElemFormat::e4m3, c))) << c;
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> dist(-500.0f, 500.0f);
  for (int i = 0; i < 10000; ++i) {
    const float x = dist(rng) * std::ldexp(1.0f, static_cast<int>(rng() % 20) - 14);
    EXPECT_EQ(encode_rne_sat(ElemFormat::ue4m3, x), encode_rne_sat(ElemFormat::e4m3, std::fabs(x))) << x;
  }
}

// Over a dense sweep of positive floats, codes never decrease as the value grows.
TEST(Formats, EncodeIsMonotone) {
  constexpr std::uint32_t kStride = 997;
  for (ElemFormat f : kElementFormats) {
    std::uint32_t last = 0;
    for (std::uint64_t b = 0; b <= float_bits(kInf); b += kStride) {
      const std::uint32_t c = encode_rne_sat(f, bits_float(static_cast<std::uint32_t>(b)));
      ASSERT_GE(c, last) << name_of(f) << " at " << bits_float(static_cast<std::uint32_t>(b));
      last = c;
    }
    EXPECT_EQ(last, max_code(f));
  }
}

TEST(Formats, PackFp4LowNibbleFirst) {
  const std::vector<std::uint8_t> codes = {0x1, 0x2, 0x3, 0x4, 0xF};
  const std::vector<std::uint8_t> expected = {0x21, 0x43, 0x0F};  // odd count: high nibble of the last byte is 0
  EXPECT_EQ(pack_fp4(codes), expected);
  EXPECT_EQ(unpack_fp4(expected, 5), codes);
  EXPECT_EQ(unpack_fp4(expected, 6), (std::vector<std::uint8_t>{0x1, 0x2, 0x3, 0x4, 0xF, 0x0}));
  for (int i = 0; i < 5; ++i) EXPECT_EQ(fp4_at(expected.data(), i), codes[i]);
  EXPECT_EQ(pack_fp4x2(0x7, 0x9), 0x97);
  EXPECT_TRUE(pack_fp4({}).empty());
}

TEST(Formats, PackUnpackRoundTripsRandomCodes) {
  std::mt19937 rng(11);
  for (std::size_t n : {1u, 2u, 31u, 1000u, 1001u}) {
    std::vector<std::uint8_t> codes(n);
    for (auto& c : codes) c = static_cast<std::uint8_t>(rng() & 0xF);
    const std::vector<std::uint8_t> packed = pack_fp4(codes);
    EXPECT_EQ(packed.size(), (n + 1) / 2);
    EXPECT_EQ(unpack_fp4(packed, static_cast<std::int64_t>(n)), codes);
  }
}

TEST(Formats, UnpackRejectsACountBeyondTheBuffer) {
  const std::vector<std::uint8_t> packed = {0x21, 0x43};
  try {
    unpack_fp4(packed, 5);
    FAIL() << "expected fp4attn::Error";
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), "count");
  }
  EXPECT_THROW(unpack_fp4(packed, -1), Error);
}

// ---- oracle 1: ml_dtypes vectors ------------------------------------------------
// The generator keeps out NaN inputs and FP8 inputs past the rounding boundary
// above the largest finite value, where ml_dtypes (no saturation, NaN → -0 for
// E2M1) and fp4attn (satfinite) differ by definition.

const test_support::OracleVectors& format_vectors() {
  static const test_support::OracleVectors v(std::string(FP4ATTN_TEST_DATA_DIR) + "/formats.vec");
  return v;
}

TEST(FormatsOracle, MlDtypesDecodeTables) {
  for (ElemFormat f : {ElemFormat::e2m1, ElemFormat::e4m3, ElemFormat::e5m2}) {
    const std::vector<float> table = format_vectors().floats(name_of(f) + ".decode");
    ASSERT_EQ(table.size(), static_cast<std::size_t>(code_count(f))) << name_of(f);
    for (int c = 0; c < code_count(f); ++c)
      EXPECT_TRUE(same_float(decode(f, c), table[c])) << name_of(f) << " code " << c;
  }
  const std::vector<float> e8m0 = format_vectors().floats("e8m0.decode");
  ASSERT_EQ(e8m0.size(), 256u);
  for (int c = 0; c < 256; ++c) EXPECT_TRUE(same_float(decode_e8m0(static_cast<std::uint8_t>(c)), e8m0[c])) << c;
}

TEST(FormatsOracle, MlDtypesEncodeVectors) {
  for (ElemFormat f : {ElemFormat::e2m1, ElemFormat::e4m3, ElemFormat::e5m2}) {
    const std::vector<float> x = format_vectors().floats(name_of(f) + ".encode.x");
    const std::vector<std::uint8_t> code = format_vectors().bytes(name_of(f) + ".encode.code");
    ASSERT_EQ(x.size(), code.size());
    ASSERT_GT(x.size(), 10000u) << name_of(f);
    std::size_t mismatches = 0;
    for (std::size_t i = 0; i < x.size(); ++i)
      if (encode_rne_sat(f, x[i]) != code[i] && ++mismatches <= 10)
        ADD_FAILURE() << name_of(f) << " x = " << x[i] << ": fp4attn " << int(encode_rne_sat(f, x[i])) << ", ml_dtypes "
                      << int(code[i]);
    EXPECT_EQ(mismatches, 0u) << name_of(f) << " of " << x.size();
  }
}

// E8M0 casts in ml_dtypes round to nearest, which neither MX scale rule does;
// on exact powers of two every rule agrees.
TEST(FormatsOracle, MlDtypesE8M0PowersOfTwo) {
  const std::vector<float> x = format_vectors().floats("e8m0.encode.x");
  const std::vector<std::uint8_t> code = format_vectors().bytes("e8m0.encode.code");
  ASSERT_EQ(x.size(), 255u);
  for (std::size_t i = 0; i < x.size(); ++i) {
    EXPECT_EQ(floor_log2(x[i]) + kE8M0Bias, code[i]) << x[i];
    EXPECT_EQ(decode_e8m0(code[i]), x[i]);
  }
}

// ---- oracle 2: the CUDA headers' host conversions ---------------------------------
#if defined(FP4ATTN_HAVE_CUDA_HEADERS)

std::uint32_t cuda_code(ElemFormat f, float x) {
  switch (f) {
    case ElemFormat::e4m3: return __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3);
    case ElemFormat::e5m2: return __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E5M2);
    case ElemFormat::e2m1: return __nv_cvt_float_to_fp4(x, __NV_E2M1, cudaRoundNearest);
    case ElemFormat::ue4m3: break;
  }
  return 0x100;  // not a code: makes any comparison fail
}

// E2M1 has no NaN: CUDA returns 6 for NaN, fp4attn an impossible code, so NaN
// inputs are compared for the FP8 formats only.
bool comparable(ElemFormat f, float x) { return f != ElemFormat::e2m1 || !std::isnan(x); }

// Counts mismatches over the bit patterns that `patterns` feeds to its callback,
// reporting the first few.
template <class Patterns>
std::uint64_t cuda_mismatches(ElemFormat f, Patterns&& patterns, std::uint64_t& checked) {
  std::uint64_t bad = 0;
  patterns([&](std::uint32_t bits) {
    const float x = bits_float(bits);
    if (!comparable(f, x)) return;
    ++checked;
    const std::uint32_t ours = encode_rne_sat(f, x), theirs = cuda_code(f, x);
    if (ours != theirs && ++bad <= 10)
      ADD_FAILURE() << name_of(f) << " bits 0x" << std::hex << bits << std::dec << " (" << x << "): fp4attn " << ours
                    << ", CUDA " << theirs;
  });
  return bad;
}

constexpr ElemFormat kCudaFormats[] = {ElemFormat::e2m1, ElemFormat::e4m3, ElemFormat::e5m2};

TEST(FormatsCuda, StrideOverAllFloatBitPatterns) {
  constexpr std::uint64_t kStride = 251;  // prime: every low-bit residue is visited
  constexpr std::uint64_t kAllPatterns = std::uint64_t{1} << 32;
  for (ElemFormat f : kCudaFormats) {
    std::uint64_t checked = 0;
    const auto sweep = [](auto&& fn) {
      for (std::uint64_t b = 0; b < kAllPatterns; b += kStride) fn(static_cast<std::uint32_t>(b));
    };
    EXPECT_EQ(cuda_mismatches(f, sweep, checked), 0u) << name_of(f);
    EXPECT_GT(checked, kAllPatterns / kStride / 2);
  }
}

// Every rounding tie of every format has at least 19 trailing zero bits, so all
// 2^16 upper halves with lower halves 0, 1, 0x8000 and 0xFFFF hit every tie and
// both of its float neighbours.
TEST(FormatsCuda, EveryTieAndItsNeighbours) {
  for (ElemFormat f : kCudaFormats) {
    std::uint64_t checked = 0;
    const auto sweep = [](auto&& fn) {
      for (std::uint32_t hi = 0; hi <= 0xFFFFu; ++hi)
        for (std::uint32_t lo : {0x0000u, 0x0001u, 0x8000u, 0xFFFFu}) fn((hi << 16) | lo);
    };
    EXPECT_EQ(cuda_mismatches(f, sweep, checked), 0u) << name_of(f);
  }
}

// Dense coverage of each format's range: every 13th float in every binade from
// a few below the smallest subnormal to one above the largest value, both signs.
TEST(FormatsCuda, DenseOverEachFormatsRange) {
  constexpr std::uint32_t kStride = 13;
  constexpr int kMarginBinades = 3;
  for (ElemFormat f : kCudaFormats) {
    const int lo = floor_log2(decode(f, 1)) - kMarginBinades;
    const int hi = floor_log2(decode(f, max_code(f))) + 1;
    const auto sweep = [&](auto&& fn) {
      const std::uint32_t first = float_bits(exp2i(lo)), last = float_bits(exp2i(hi + 1));
      for (std::uint32_t b = first; b < last; b += kStride) {
        fn(b);
        fn(b | 0x80000000u);
      }
    };
    std::uint64_t checked = 0;
    EXPECT_EQ(cuda_mismatches(f, sweep, checked), 0u) << name_of(f);
    std::cout << name_of(f) << ": " << checked << " inputs compared with CUDA in its range\n";
  }
}

float half_raw_to_float(__half_raw h) { return __half2float(__half(h)); }

TEST(FormatsCuda, DecodeEveryCode) {
  for (int c = 0; c < 256; ++c) {
    const auto code = static_cast<__nv_fp8_storage_t>(c);
    EXPECT_TRUE(same_float(decode(ElemFormat::e4m3, c), half_raw_to_float(__nv_cvt_fp8_to_halfraw(code, __NV_E4M3))))
        << c;
    EXPECT_TRUE(same_float(decode(ElemFormat::e5m2, c), half_raw_to_float(__nv_cvt_fp8_to_halfraw(code, __NV_E5M2))))
        << c;
  }
  for (int c = 0; c < 16; ++c)
    EXPECT_TRUE(same_float(decode(ElemFormat::e2m1, c),
                           half_raw_to_float(__nv_cvt_fp4_to_halfraw(static_cast<__nv_fp4_storage_t>(c), __NV_E2M1))))
        << c;
}

// __nv_fp4x2 keeps .x (the even element) in the low nibble, as pack_fp4 does.
TEST(FormatsCuda, PackingMatchesFp4x2) {
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> dist(-7.0f, 7.0f);
  for (int i = 0; i < 10000; ++i) {
    const float a = dist(rng), b = dist(rng);
    const std::uint8_t ours = pack_fp4x2(encode_rne_sat(ElemFormat::e2m1, a), encode_rne_sat(ElemFormat::e2m1, b));
    EXPECT_EQ(ours, __nv_cvt_float2_to_fp4x2(float2{a, b}, __NV_E2M1, cudaRoundNearest)) << a << ", " << b;
  }
}

#else

TEST(FormatsCuda, NeedsTheCudaHeaders) { GTEST_SKIP() << "built without the CUDA headers (FP4ATTN_HAVE_CUDA_HEADERS)"; }

#endif

}  // namespace
}  // namespace fp4attn
