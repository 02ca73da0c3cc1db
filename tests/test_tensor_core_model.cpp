// The sm90 FP8 wgmma accumulation model (src/emulator/tensor_core.hpp):
// hand-derived cases first, each failing under one plausible alternative
// rule; then outputs the H200 produced for recorded inputs
// (tests/data/wgmma_e4m3_k32.bin, written by dev/wgmma_accumulation/); then
// the model's place in the emulator.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "emulator/tensor_core.hpp"
#include "emulator_fixtures.hpp"
#include "fp4attn/emulator.hpp"
#include "fp4attn/formats.hpp"
#include "fp4attn/metrics.hpp"

namespace fp4attn::emulator {
namespace {

constexpr float kSubnormalHalfMin = 0x1p-7f;  // E4M3 subnormal 4·2^-9, aligned like 2^-6

// One k-step of up to 32 products for a single output.
float mma_step(const std::vector<float>& a, const std::vector<float>& b, float c) {
  std::vector<float> ae(a.size()), be(b.size());
  e4m3_exponents(a.data(), static_cast<std::int64_t>(a.size()), ae.data());
  e4m3_exponents(b.data(), static_cast<std::int64_t>(b.size()), be.data());
  float scratch[2];
  fp8_mma_step(a.data(), ae.data(), b.data(), be.data(), 1, static_cast<int>(a.size()), 1, &c, scratch);
  return c;
}

float fp32_sum(const std::vector<float>& a, const std::vector<float>& b, float c) {
  for (std::size_t k = 0; k < a.size(); ++k) c += a[k] * b[k];
  return c;
}

// ---- known answers ------------------------------------------------------------------

TEST(Fp8MmaModel, SmallSumsAreExact) {
  const std::vector<float> a(kFp8MmaK, 1.0f), b(kFp8MmaK, -3.0f);
  EXPECT_EQ(mma_step(a, b, 0.0f), -96.0f);
  EXPECT_EQ(mma_step(a, b, 100.0f), 4.0f);
}

// 256 sets emax = 8, so addends keep bits down to 2^-5: the 31 products of
// −2^-6 vanish. Truncating them toward −∞ instead would leave 256 − 31·2^-5.
TEST(Fp8MmaModel, AddendsAreTruncatedTowardZeroAtTheLargestExponent) {
  std::vector<float> a(kFp8MmaK, -0.125f), b(kFp8MmaK, 0.125f);
  a[7] = 16.0f, b[7] = 16.0f;
  EXPECT_EQ(mma_step(a, b, 0.0f), 256.0f);
  EXPECT_NE(fp32_sum(a, b, 0.0f), 256.0f) << "the case must tell the model from fp32";
}

// The accumulator is an addend like the products: its bits below 2^(emax − 13) go.
TEST(Fp8MmaModel, AccumulatorIsAlignedLikeTheProducts) {
  const std::vector<float> zeros(kFp8MmaK, 0.0f);
  EXPECT_EQ(mma_step(zeros, zeros, 1.0f + 0x1p-20f), 1.0f);
  EXPECT_EQ(mma_step(zeros, zeros, -(1.0f + 0x1p-13f)), -(1.0f + 0x1p-13f));
}

// 16383 + 2 = 16385 needs 15 bits; the result keeps 14, truncated.
TEST(Fp8MmaModel, ResultKeepsFourteenSignificantBits) {
  std::vector<float> a(kFp8MmaK, 0.0f), b(kFp8MmaK, 0.0f);
  a[0] = 2.0f, b[0] = 1.0f;
  EXPECT_EQ(mma_step(a, b, 16383.0f), 16384.0f);
  a[0] = -2.0f;
  EXPECT_EQ(mma_step(a, b, -16383.0f), -16384.0f);
}

// 1.5·1.5 = 2.25 aligns by ea + eb = 0 although it lies in binade 1, so two
// products of 2^-13 (E4M3 2^-6 · 2^-7) survive as one unit of 2^-12.
TEST(Fp8MmaModel, ProductsAlignBySumOfOperandExponents) {
  std::vector<float> a(kFp8MmaK, 0.0f), b(kFp8MmaK, 0.0f);
  a[0] = 1.5f, b[0] = 1.5f;
  a[9] = a[20] = 0x1p-6f, b[9] = b[20] = kSubnormalHalfMin;
  EXPECT_EQ(mma_step(a, b, 0.0f), 2.25f + 0x1p-12f);
}

// A zero times 448 must not raise emax to −6 + 8: the two 2^-13 products stay.
TEST(Fp8MmaModel, ZeroOperandsNeverSetTheAlignment) {
  std::vector<float> a(kFp8MmaK, 0.0f), b(kFp8MmaK, 0.0f);
  b[0] = 448.0f;
  a[1] = 1.0f, b[1] = 1.0f;
  a[2] = a[3] = 0x1p-6f, b[2] = b[3] = kSubnormalHalfMin;
  EXPECT_EQ(mma_step(a, b, 0.0f), 1.0f + 0x1p-12f);
}

// The emulator calls the model for many outputs at once with a strided B and
// partial key groups; that must equal one output at a time.
TEST(Fp8MmaModel, ManyOutputsEqualOneAtATime) {
  constexpr int kTerms = 20, kCount = 77, kStride = 128;
  std::mt19937 gen(7);
  std::uniform_int_distribution<int> code(0, 0x7E), sign(0, 1);
  auto e4m3 = [&] { return decode(ElemFormat::e4m3, static_cast<std::uint8_t>(code(gen) | (sign(gen) << 7))); };
  std::vector<float> a(kTerms), b(kTerms * kStride), acc(kCount);
  for (float& x : a) x = e4m3();
  for (float& x : b) x = e4m3();
  for (float& x : acc) x = std::ldexp(e4m3(), 3);
  std::vector<float> ae(kTerms), be(b.size()), scratch(2 * kCount), many = acc;
  e4m3_exponents(a.data(), kTerms, ae.data());
  e4m3_exponents(b.data(), static_cast<std::int64_t>(b.size()), be.data());
  fp8_mma_step(a.data(), ae.data(), b.data(), be.data(), kStride, kTerms, kCount, many.data(), scratch.data());
  for (int n = 0; n < kCount; ++n) {
    std::vector<float> column(kTerms);
    for (int k = 0; k < kTerms; ++k) column[k] = b[k * kStride + n];
    EXPECT_EQ(many[n], mma_step(a, column, acc[n])) << "output " << n;
  }
}

// ---- outputs recorded on the H200 ---------------------------------------------------

struct Record {
  int steps = 1;
  bool zero_init = true;
  float c = 0.0f, d = 0.0f;  // initial accumulator and the hardware's result
  std::vector<float> a, b;   // steps · 32 E4M3 values each
};

// Format (little endian): "WGMMAK32", u32 version 1, u32 count, then per record
// u8 steps, u8 zero_init, u8 family, u8 c_mode, f32 c, f32 d, steps·32 A codes, steps·32 B codes.
std::vector<Record> read_records(const std::string& path) {
  FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) return {};
  std::vector<std::uint8_t> bytes;
  for (int ch; (ch = std::fgetc(f)) != EOF;) bytes.push_back(static_cast<std::uint8_t>(ch));
  std::fclose(f);
  constexpr std::size_t kHeader = 16, kRecordHead = 12;
  if (bytes.size() < kHeader || std::memcmp(bytes.data(), "WGMMAK32", 8) != 0) return {};
  std::uint32_t version, count;
  std::memcpy(&version, &bytes[8], 4);
  std::memcpy(&count, &bytes[12], 4);
  if (version != 1) return {};
  std::vector<Record> out;
  std::size_t at = kHeader;
  for (std::uint32_t r = 0; r < count && at + kRecordHead <= bytes.size(); ++r) {
    Record rec;
    rec.steps = bytes[at];
    rec.zero_init = bytes[at + 1] != 0;
    std::memcpy(&rec.c, &bytes[at + 4], 4);
    std::memcpy(&rec.d, &bytes[at + 8], 4);
    at += kRecordHead;
    const std::size_t n = static_cast<std::size_t>(rec.steps) * kFp8MmaK;
    if (at + 2 * n > bytes.size()) return {};
    for (std::size_t k = 0; k < n; ++k) rec.a.push_back(decode(ElemFormat::e4m3, bytes[at + k]));
    for (std::size_t k = 0; k < n; ++k) rec.b.push_back(decode(ElemFormat::e4m3, bytes[at + n + k]));
    at += 2 * n;
    out.push_back(std::move(rec));
  }
  return out;
}

TEST(Fp8MmaModel, MatchesRecordedH200OutputsBitForBit) {
  const std::vector<Record> records = read_records(std::string(FP4ATTN_TEST_DATA_DIR) + "/wgmma_e4m3_k32.bin");
  ASSERT_GE(records.size(), 800u) << "test vectors missing or truncated";
  std::size_t chained = 0, model_wrong = 0, fp32_wrong = 0;
  for (std::size_t r = 0; r < records.size(); ++r) {
    const Record& rec = records[r];
    chained += rec.steps > 1;
    float acc = rec.zero_init ? 0.0f : rec.c, plain = acc;
    for (int s = 0; s < rec.steps; ++s) {
      const auto from = static_cast<std::ptrdiff_t>(s * kFp8MmaK), to = from + kFp8MmaK;
      const std::vector<float> a(rec.a.begin() + from, rec.a.begin() + to), b(rec.b.begin() + from, rec.b.begin() + to);
      acc = mma_step(a, b, acc);
      plain = fp32_sum(a, b, plain);
    }
    fp32_wrong += std::memcmp(&plain, &rec.d, sizeof(float)) != 0;
    if (std::memcmp(&acc, &rec.d, sizeof(float)) != 0 && model_wrong++ < 5)
      ADD_FAILURE() << "record " << r << ": model " << std::hexfloat << acc << ", H200 " << rec.d;
  }
  EXPECT_EQ(model_wrong, 0u);
  EXPECT_GT(chained, 100u) << "chained k32 steps must be covered";
  // The vectors must be able to tell the model from plain fp32 accumulation.
  EXPECT_GT(fp32_wrong, records.size() / 2);
}

// ---- the model inside the emulator --------------------------------------------------

TEST(Fp8MmaModel, AppliesWhereTheProductsRunOnFp8Wgmma) {
  AttentionOptions o;
  EXPECT_TRUE(uses_fp8_mma_model(o)) << "the default is recipe fp8 on sm90 with tensor-core accumulation";
  for (Recipe r : {Recipe::mxfp4, Recipe::mxfp4_train}) {
    o.recipe = r;
    EXPECT_TRUE(uses_fp8_mma_model(o)) << to_string(r) << " folds into E4M3 on sm90";
  }
  o.recipe = Recipe::nvfp4;
  EXPECT_FALSE(uses_fp8_mma_model(o)) << "NVFP4 runs on BF16 wgmma";
  o.recipe = Recipe::fp8;
  o.target = Target::sm100;
  EXPECT_FALSE(uses_fp8_mma_model(o));
  o.target = Target::sm90;
  o.accumulation = Accumulation::fp32;
  EXPECT_FALSE(uses_fp8_mma_model(o));
}

// On sm90 FP8 the model moves every LSE a little (truncation biases the
// scores toward zero) and O by about a bf16 ulp; where it does not apply the
// option changes nothing.
TEST(Fp8MmaModel, EmulatorUsesItOnlyWhereItApplies) {
  const AttentionShape s{.B = 1, .Hq = 2, .Hkv = 1, .Sq = 70, .Sk = 300, .D = 64};
  const testing::Inputs x = testing::realistic_inputs(s, 1001);
  auto run = [&](Recipe r, Target t, Accumulation a) {
    AttentionOptions o;
    o.recipe = r, o.target = t, o.accumulation = a, o.block_q = 64, o.block_k = 64;
    return forward(s, x.q, x.k, x.v, o);
  };
  const ForwardResult model = run(Recipe::fp8, Target::sm90, Accumulation::tensor_core);
  const ForwardResult fp32 = run(Recipe::fp8, Target::sm90, Accumulation::fp32);
  const ErrorMetrics lse = compare(model.lse, fp32.lse);
  EXPECT_GT(lse.max_abs, 0.0) << "the model must change the scores";
  EXPECT_LT(lse.max_abs, 5e-2);
  EXPECT_LT(compare(model.o, fp32.o).rel_l2, 1e-2);
  for (auto [r, t] : {std::pair{Recipe::nvfp4, Target::sm90}, std::pair{Recipe::mxfp4, Target::sm100}}) {
    const ForwardResult a = run(r, t, Accumulation::tensor_core), b = run(r, t, Accumulation::fp32);
    EXPECT_EQ(a.o, b.o) << to_string(r) << " " << to_string(t);
    EXPECT_EQ(a.lse, b.lse) << to_string(r) << " " << to_string(t);
  }
}

}  // namespace
}  // namespace fp4attn::emulator
