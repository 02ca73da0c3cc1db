// The emulator's model of sm90's ex2.approx.ftz.f32 (emulator/ex2_sm90.hpp):
// the boundary rules cover every code decision of the exp2 P paths, the
// measured table is well formed, and the model returns the table's value
// where it has one and exp2f elsewhere.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "emulator/ex2_sm90.hpp"
#include "fp4attn/formats.hpp"
#include "fp4attn/quantize.hpp"

namespace fp4attn::emulator {
namespace {

constexpr std::uint32_t kCell = 1u << ex2::kGridShift;

std::uint32_t ulps_apart(std::uint32_t a, std::uint32_t b) { return a > b ? a - b : b - a; }

// Every code decision the exp2 paths make from a P value r: E4M3 of r (FP8
// P), the MX block scale of r as block maximum (both rules), the E2M1 code
// of r·2^-E for every block exponent E that puts r·2^-E in [2^-4, 16), the
// NVFP4 block scale of r as block maximum (tensor scale 1), and the E2M1 code
// of fl(r / s_b) for every nonzero UE4M3 scale s_b.
struct Decisions {
  std::uint8_t e4m3, scale_up, scale_ocp;
  std::uint8_t e2m1[8];
  std::uint8_t nv_scale;
  std::uint8_t nv_e2m1[127];
  bool operator==(const Decisions&) const = default;
};

Decisions decide(float r) {
  Decisions d{};
  d.e4m3 = encode_rne_sat(ElemFormat::e4m3, r);
  d.scale_up = mx_scale_code(r, MxScaleRule::round_up);
  d.scale_ocp = mx_scale_code(r, MxScaleRule::ocp_floor);
  const int e = floor_log2(r);
  for (int i = 0; i < 8; ++i) d.e2m1[i] = encode_rne_sat(ElemFormat::e2m1, r * exp2i(-(e - 4 + i)));
  d.nv_scale = nvfp4_block_scale_code(r, 1.0f);
  for (int c = 1; c < 128; ++c) d.nv_e2m1[c - 1] = encode_rne_sat(ElemFormat::e2m1, r / decode(ElemFormat::ue4m3, c));
  return d;
}

// Whether a boundary lies in [a, b] (bits of positive normal floats, a ≤ b).
bool boundary_between(std::uint32_t a, std::uint32_t b) {
  for (std::uint32_t g = (a + kCell - 1) & ~(kCell - 1); g <= b; g += kCell)
    if (ex2::is_decision_boundary(g)) return true;
  return false;
}

TEST(Ex2Model, BoundariesCoverEveryCodeDecision) {
  // Values near the 1/64-binade grid (where all boundaries lie) and anywhere,
  // over the results the exp2 paths see: two floats with no boundary between
  // them must get the same codes and scales.
  std::mt19937 rng(20261130);
  std::uniform_int_distribution<int> binade(-120, 8), grid_point(0, ex2::kGridSteps - 1), offset(-40, 40),
      step(1, 40);
  // Half the grid samples in NVFP4's binades, where most boundaries are.
  std::uniform_int_distribution<int> nv_binade(ex2::kNvfp4FirstBinade, ex2::kNvfp4LastBinade);
  std::uniform_int_distribution<std::uint32_t> any_bits(float_bits(0x1p-120f), float_bits(512.0f));
  int compared = 0, across = 0;
  for (int n = 0; n < 400000; ++n) {
    std::uint32_t a;
    if (n % 4 == 0) {
      a = any_bits(rng);
    } else {
      const int be = n % 2 == 0 ? nv_binade(rng) : binade(rng);
      const std::uint32_t g = (static_cast<std::uint32_t>(be + 127) << 23) |
                              (static_cast<std::uint32_t>(grid_point(rng)) << ex2::kGridShift);
      a = g + static_cast<std::uint32_t>(offset(rng));
    }
    const std::uint32_t b = a + static_cast<std::uint32_t>(step(rng));
    if (boundary_between(a, b)) {
      ++across;
      continue;
    }
    ++compared;
    ASSERT_EQ(decide(bits_float(a)), decide(bits_float(b))) << std::hexfloat << bits_float(a) << " " << bits_float(b);
  }
  EXPECT_GT(compared, 100000);
  EXPECT_GT(across, 10000);  // the sampling does reach the boundaries
}

TEST(Ex2Model, E4m3MidpointsAreBoundaries) {
  for (std::uint32_t c = 0; c < 0x7E; ++c) {
    const float mid = 0.5f * (decode(ElemFormat::e4m3, c) + decode(ElemFormat::e4m3, c + 1));
    EXPECT_TRUE(ex2::near_decision_boundary(float_bits(mid), 0)) << std::hexfloat << mid;
  }
}

TEST(Ex2Model, Nvfp4ThresholdsAreBoundaries) {
  // Up to P's largest value 2^8: 6 × every UE4M3 rounding midpoint (block
  // scale), and every E2M1 midpoint times every nonzero UE4M3 value (codes).
  int checked = 0;
  for (std::uint32_t c = 0; c < 0x7E; ++c) {
    const float mid = 0.5f * (decode(ElemFormat::ue4m3, c) + decode(ElemFormat::ue4m3, c + 1));
    if (6.0f * mid > 256.0f) break;
    ++checked;
    EXPECT_TRUE(ex2::near_decision_boundary(float_bits(6.0f * mid), 0)) << std::hexfloat << 6.0f * mid;
  }
  for (std::uint32_t c = 1; c < 0x7F; ++c)
    for (float m : {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f}) {
      const float t = m * decode(ElemFormat::ue4m3, c);
      if (t > 256.0f) continue;
      ++checked;
      EXPECT_TRUE(ex2::near_decision_boundary(float_bits(t), 0)) << std::hexfloat << t << " code " << c;
    }
  EXPECT_GT(checked, 500);
}

TEST(Ex2Model, TableIsSortedDisjointAndInsideTheWindows) {
  const auto table = ex2::sm90_table();
  ASSERT_GT(table.size(), 1000u) << "the measured table is missing";
  std::uint32_t prev_last = 0;
  std::size_t flushed = 0;
  for (std::size_t i = 0; i < table.size(); ++i) {
    const ex2::Run& r = table[i];
    const std::uint32_t first = ex2::order_key(r.x_first), last = ex2::order_key(r.x_last);
    ASSERT_LE(first, last) << i;
    if (i > 0) {
      ASSERT_LT(prev_last, first) << i;
    }
    prev_last = last;
    ASSERT_LE(bits_float(r.x_last), ex2::kScanMax) << i;
    ASSERT_TRUE(ex2::recorded(r.result)) << i;
    if (r.result < ex2::kMinNormalBits) {
      ++flushed;
      EXPECT_EQ(r.result, 0u) << i;  // ftz: +0, never a subnormal
      continue;
    }
    // The host's exp2f must be within a few steps of the hardware, or the
    // lookup guard (and the argument for returning exp2f elsewhere) fails.
    for (const std::uint32_t x : {r.x_first, r.x_last})
      EXPECT_LE(ulps_apart(float_bits(exp2f(bits_float(x))), r.result), 4u) << std::hexfloat << bits_float(x);
  }
  EXPECT_EQ(flushed, 1u);  // one run from -inf up to where results turn normal
}

TEST(Ex2Model, ReturnsTheTableInsideRunsAndExp2fElsewhere) {
  const auto table = ex2::sm90_table();
  ASSERT_FALSE(table.empty());
  for (const ex2::Run& r : table) {
    const std::uint32_t first = ex2::order_key(r.x_first), last = ex2::order_key(r.x_last);
    for (const std::uint32_t key : {first, first + (last - first) / 2, last}) {
      const std::uint32_t xb = (key & 0x80000000u) != 0 ? key & 0x7FFFFFFFu : ~key;
      ASSERT_EQ(float_bits(ex2::sm90(bits_float(xb))), r.result) << std::hexfloat << bits_float(xb);
      EXPECT_EQ(ex2_for_target(Target::sm100, bits_float(xb)), exp2f(bits_float(xb)));
    }
  }
  // Away from the table the model is exp2f, bit for bit.
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> x_dist(-30.0f, ex2::kScanMax);
  int outside = 0;
  for (int n = 0; n < 200000; ++n) {
    const float x = x_dist(rng);
    const std::uint32_t key = ex2::order_key(float_bits(x));
    const auto it = std::upper_bound(table.begin(), table.end(), key,
                                     [](std::uint32_t k, const ex2::Run& r) { return k < ex2::order_key(r.x_first); });
    if (it != table.begin() && key <= ex2::order_key((it - 1)->x_last)) continue;
    ++outside;
    ASSERT_EQ(float_bits(ex2::sm90(x)), float_bits(exp2f(x))) << std::hexfloat << x;
  }
  EXPECT_GT(outside, 190000);
  EXPECT_TRUE(std::isnan(ex2::sm90(NAN)));
  EXPECT_EQ(ex2::sm90(-INFINITY), 0.0f);
  EXPECT_EQ(ex2::sm90(16.0f), 65536.0f);  // above the scanned range: exp2f
}

TEST(Ex2Model, Fp8CodeExp2FollowsTheModel) {
  // Wherever the table moves a result across an E4M3 midpoint, the sm90 code
  // follows the hardware and the sm100 code stays exp2f's.
  const auto table = ex2::sm90_table();
  int checked = 0;
  for (const ex2::Run& r : table) {
    const float x = bits_float(r.x_first);
    if (r.result < ex2::kMinNormalBits || !(x >= -11.0f)) continue;
    const float u = x - 8.0f;
    if (u + 8.0f != x) continue;  // fp8_code_exp2 takes u: only x that u + 8 reproduces
    ++checked;
    EXPECT_EQ(fp8_code_exp2(Target::sm90, u), encode_rne_sat(ElemFormat::e4m3, bits_float(r.result)));
    EXPECT_EQ(fp8_code_exp2(Target::sm100, u), encode_rne_sat(ElemFormat::e4m3, exp2f(x)));
  }
  EXPECT_GT(checked, 100);
}

}  // namespace
}  // namespace fp4attn::emulator
