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
// P), the MX block scale of r as block maximum (both rules), and the E2M1
// code of r·2^-E for every block exponent E that puts r·2^-E in [2^-4, 16).
struct Decisions {
  std::uint8_t e4m3, scale_up, scale_ocp;
  std::uint8_t e2m1[8];
  bool operator==(const Decisions&) const = default;
};

Decisions decide(float r) {
  Decisions d{};
  d.e4m3 = encode_rne_sat(ElemFormat::e4m3, r);
  d.scale_up = mx_scale_code(r, MxScaleRule::round_up);
  d.scale_ocp = mx_scale_code(r, MxScaleRule::ocp_floor);
  const int e = floor_log2(r);
  for (int i = 0; i < 8; ++i) d.e2m1[i] = encode_rne_sat(ElemFormat::e2m1, r * exp2i(-(e - 4 + i)));
  return d;
}

// Whether a boundary lies in [a, b] (bits of positive normal floats, a ≤ b).
bool boundary_between(std::uint32_t a, std::uint32_t b) {
  for (std::uint32_t g = (a + kCell - 1) & ~(kCell - 1); g <= b; g += kCell)
    if (ex2::is_decision_boundary(g)) return true;
  return false;
}

TEST(Ex2Model, BoundariesCoverEveryCodeDecision) {
  // Values near the 1/16-binade grid (where all boundaries lie) and anywhere,
  // over the results the exp2 paths see: two floats with no boundary between
  // them must get the same codes and scales.
  std::mt19937 rng(20261130);
  std::uniform_int_distribution<int> binade(-120, 8), sixteenth(0, 15), offset(-40, 40), step(1, 40);
  std::uniform_int_distribution<std::uint32_t> any_bits(float_bits(0x1p-120f), float_bits(512.0f));
  int compared = 0, across = 0;
  for (int n = 0; n < 400000; ++n) {
    std::uint32_t a;
    if (n % 4 == 0) {
      a = any_bits(rng);
    } else {
      const std::uint32_t g = (static_cast<std::uint32_t>(binade(rng) + 127) << 23) |
                              (static_cast<std::uint32_t>(sixteenth(rng)) << ex2::kGridShift);
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
