// The fp64 reference: known answers first, then masks, GQA, the key-shift
// invariance smooth_k relies on, an independent straightforward evaluation,
// finite-difference gradients, and bad input.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "fp4attn/error.hpp"
#include "fp4attn/reference.hpp"

namespace fp4attn::reference {
namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();
// Different evaluation orders of the same double sums agree to a few ulps of
// values of order 1; this leaves ample room and still catches any wrong term.
constexpr double kRoundoffTol = 1e-12;

std::vector<double> random_vector(std::int64_t n, std::uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<double> dist(-1.0, 1.0);
  std::vector<double> x(n);
  for (double& e : x) e = dist(gen);
  return x;
}

struct Problem {
  std::vector<double> q, k, v;
};

Problem random_problem(const AttentionShape& s, std::uint64_t seed) {
  return {random_vector(s.q_elems(), seed), random_vector(s.kv_elems(), seed + 1),
          random_vector(s.kv_elems(), seed + 2)};
}

AttentionShape make_shape(std::int64_t B, std::int64_t Hq, std::int64_t Hkv, std::int64_t Sq, std::int64_t Sk,
                          std::int64_t D) {
  return {.B = B, .Hq = Hq, .Hkv = Hkv, .Sq = Sq, .Sk = Sk, .D = D};
}

void expect_all_near(const std::vector<double>& actual, const std::vector<double>& expected, double tol,
                     const std::string& what) {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  for (std::size_t i = 0; i < actual.size(); ++i) {
    if (std::isinf(expected[i])) {
      EXPECT_EQ(actual[i], expected[i]) << what << " at " << i;
    } else {
      EXPECT_NEAR(actual[i], expected[i], tol) << what << " at " << i;
    }
  }
}

double l2_norm(const std::vector<double>& x) {
  double s = 0.0;
  for (double e : x) s += e * e;
  return std::sqrt(s);
}

// ---- Known answers ---------------------------------------------------------

// Q = K = 0 makes every visible score 0: P is uniform, O = mean of V = 1 and
// LSE = ln(number of visible keys).
TEST(ReferenceForward, ZeroScoresGiveMeanOfValuesAndLogOfKeyCount) {
  const AttentionShape s = make_shape(2, 4, 2, 5, 7, 8);
  const std::vector<double> q(s.q_elems(), 0.0), k(s.kv_elems(), 0.0), v(s.kv_elems(), 1.0);
  const ForwardResult r = forward(s, q, k, v, MaskKind::none, 0.0);
  expect_all_near(r.o, std::vector<double>(s.q_elems(), 1.0), kRoundoffTol, "O");
  expect_all_near(r.lse, std::vector<double>(s.lse_elems(), std::log(7.0)), kRoundoffTol, "LSE");
}

// Bottom-right causal with Sq > Sk: the first Sq − Sk rows see no key at all.
TEST(ReferenceForward, BottomRightCausalMasksLeadingRowsWhenQueriesOutnumberKeys) {
  const AttentionShape s = make_shape(1, 2, 1, 6, 4, 8);
  const std::vector<double> q(s.q_elems(), 0.0), k(s.kv_elems(), 0.0), v(s.kv_elems(), 1.0);
  const ForwardResult r = forward(s, q, k, v, MaskKind::causal, 0.0);
  const std::int64_t masked_rows = s.Sq - s.Sk;
  for (std::int64_t h = 0; h < s.Hq; ++h)
    for (std::int64_t i = 0; i < s.Sq; ++i) {
      const double lse = r.lse[h * s.Sq + i];
      const double o = r.o[bshd_index(s.Sq, s.Hq, s.D, 0, i, h, 0)];
      if (i < masked_rows) {
        EXPECT_EQ(lse, kNegInf) << "row " << i;
        EXPECT_EQ(o, 0.0) << "row " << i;
      } else {
        EXPECT_NEAR(lse, std::log(static_cast<double>(i - masked_rows + 1)), kRoundoffTol) << "row " << i;
        EXPECT_NEAR(o, 1.0, kRoundoffTol) << "row " << i;
      }
    }
}

// Worked by hand. D = 4, so the default scale is 1/2. Row 0: q = (2,0,0,0)
// scores (1, 0, 0) against one-hot keys; row 1: q = (0,0,0,3) scores (0,0,0).
// V is the identity, so O is P itself.
TEST(ReferenceForward, OneHotCaseComputedByHand) {
  const AttentionShape s = make_shape(1, 1, 1, 2, 3, 4);
  const std::vector<double> q = {2, 0, 0, 0, 0, 0, 0, 3};
  const std::vector<double> k = {1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 0};
  const std::vector<double> v = k;
  const double e = std::exp(1.0);
  const ForwardResult r = forward(s, q, k, v, MaskKind::none, 0.0);
  const std::vector<double> o = {e / (e + 2), 1 / (e + 2), 1 / (e + 2), 0, 1.0 / 3, 1.0 / 3, 1.0 / 3, 0};
  expect_all_near(r.o, o, kRoundoffTol, "O");
  expect_all_near(r.lse, {std::log(e + 2), std::log(3.0)}, kRoundoffTol, "LSE");
}

TEST(ReferenceForward, NonPositiveScaleMeansInverseSqrtHeadDim) {
  const AttentionShape s = make_shape(1, 2, 2, 3, 5, 9);
  const Problem p = random_problem(s, 11);
  const ForwardResult expected = forward(s, p.q, p.k, p.v, MaskKind::none, 1.0 / 3.0);
  for (double scale : {0.0, -2.0}) {
    const ForwardResult r = forward(s, p.q, p.k, p.v, MaskKind::none, scale);
    expect_all_near(r.o, expected.o, kRoundoffTol, "O");
    expect_all_near(r.lse, expected.lse, kRoundoffTol, "LSE");
  }
}

// ---- Independent evaluation --------------------------------------------------

// The textbook formula, evaluated element by element through the (B, S, H, D)
// index: exp without max subtraction (the scores are small), sums in natural
// order. Catches any layout or head-mapping mistake.
TEST(ReferenceForward, MatchesStraightforwardEvaluationOnRandomData) {
  const AttentionShape s = make_shape(2, 6, 3, 4, 7, 5);
  const Problem p = random_problem(s, 21);
  const double scale = 0.8;
  const ForwardResult r = forward(s, p.q, p.k, p.v, MaskKind::none, scale);
  for (std::int64_t b = 0; b < s.B; ++b)
    for (std::int64_t h = 0; h < s.Hq; ++h)
      for (std::int64_t i = 0; i < s.Sq; ++i) {
        const std::int64_t hk = h / (s.Hq / s.Hkv);
        std::vector<double> w(s.Sk);
        double l = 0.0;
        for (std::int64_t j = 0; j < s.Sk; ++j) {
          double dot = 0.0;
          for (std::int64_t d = 0; d < s.D; ++d)
            dot += p.q[bshd_index(s.Sq, s.Hq, s.D, b, i, h, d)] * p.k[bshd_index(s.Sk, s.Hkv, s.D, b, j, hk, d)];
          w[j] = std::exp(scale * dot);
          l += w[j];
        }
        EXPECT_NEAR(r.lse[(b * s.Hq + h) * s.Sq + i], std::log(l), kRoundoffTol);
        for (std::int64_t d = 0; d < s.D; ++d) {
          double o = 0.0;
          for (std::int64_t j = 0; j < s.Sk; ++j) o += w[j] / l * p.v[bshd_index(s.Sk, s.Hkv, s.D, b, j, hk, d)];
          EXPECT_NEAR(r.o[bshd_index(s.Sq, s.Hq, s.D, b, i, h, d)], o, kRoundoffTol);
        }
      }
}

// ---- Causal alignment --------------------------------------------------------

struct AlignmentCase {
  MaskKind mask;
  std::int64_t Sq, Sk;
  std::vector<std::int64_t> visible_per_row;  // written out by hand from the mask's definition
};

// Each causal row must equal unmasked attention over exactly its visible
// prefix of keys, computed as a separate one-query problem.
TEST(ReferenceForward, CausalRowsEqualAttentionOverTheirVisiblePrefix) {
  const std::vector<AlignmentCase> cases = {
      {MaskKind::causal, 3, 5, {3, 4, 5}},               // Sq < Sk: bottom-right sees the extra keys
      {MaskKind::causal, 5, 3, {0, 0, 1, 2, 3}},         // Sq > Sk: leading rows fully masked
      {MaskKind::causal_top_left, 3, 5, {1, 2, 3}},      // top-left ignores the length difference
      {MaskKind::causal_top_left, 5, 3, {1, 2, 3, 3, 3}},
      {MaskKind::causal, 4, 4, {1, 2, 3, 4}},            // equal lengths: both kinds agree
      {MaskKind::causal_top_left, 4, 4, {1, 2, 3, 4}},
  };
  constexpr std::int64_t kD = 6;
  constexpr double kScale = 0.9;
  for (const AlignmentCase& c : cases) {
    SCOPED_TRACE("Sq=" + std::to_string(c.Sq) + " Sk=" + std::to_string(c.Sk) +
                 (c.mask == MaskKind::causal ? " bottom-right" : " top-left"));
    const AttentionShape s = make_shape(1, 1, 1, c.Sq, c.Sk, kD);
    const Problem p = random_problem(s, 31 + c.Sq);
    const ForwardResult r = forward(s, p.q, p.k, p.v, c.mask, kScale);
    for (std::int64_t i = 0; i < c.Sq; ++i) {
      const std::int64_t n = c.visible_per_row[i];
      for (std::int64_t j = 0; j < c.Sk; ++j)
        EXPECT_EQ(visible(c.mask, Window{}, c.Sq, c.Sk, i, j), j < n) << i << "," << j;
      const double* o_row = r.o.data() + i * kD;
      if (n == 0) {
        EXPECT_EQ(r.lse[i], kNegInf);
        for (std::int64_t d = 0; d < kD; ++d) EXPECT_EQ(o_row[d], 0.0);
        continue;
      }
      const AttentionShape one = make_shape(1, 1, 1, 1, n, kD);
      const std::vector<double> q_row(p.q.begin() + i * kD, p.q.begin() + (i + 1) * kD);
      const std::vector<double> k_prefix(p.k.begin(), p.k.begin() + n * kD);
      const std::vector<double> v_prefix(p.v.begin(), p.v.begin() + n * kD);
      const ForwardResult e = forward(one, q_row, k_prefix, v_prefix, MaskKind::none, kScale);
      EXPECT_NEAR(r.lse[i], e.lse[0], kRoundoffTol) << "row " << i;
      for (std::int64_t d = 0; d < kD; ++d) EXPECT_NEAR(o_row[d], e.o[d], kRoundoffTol) << "row " << i;
    }
  }
}

// A sliding window keeps each row's keys [first, end), written out by hand
// from FlashAttention's window_size definition (d = Sk − Sq, or 0 top-left).
struct WindowCase {
  MaskKind mask;
  Window window;
  std::int64_t Sq, Sk;
  std::vector<std::pair<std::int64_t, std::int64_t>> keys_per_row;  // [first, end)
};

// Each row must equal unmasked attention over exactly its window's keys.
TEST(ReferenceForward, WindowRowsEqualAttentionOverTheirKeys) {
  const std::vector<WindowCase> cases = {
      // left 1, causal, Sq = Sk: keys i − 1 .. i
      {MaskKind::causal, {1, -1}, 4, 4, {{0, 1}, {0, 2}, {1, 3}, {2, 4}}},
      // left 1, right 0 is the same
      {MaskKind::none, {1, 0}, 4, 4, {{0, 1}, {0, 2}, {1, 3}, {2, 4}}},
      // left 0, right 1, Sq < Sk: d = 2, keys i + 2 .. i + 3
      {MaskKind::none, {0, 1}, 3, 5, {{2, 4}, {3, 5}, {4, 5}}},
      // left 2 only: keys from i + d − 2 to the end, d = −2 (Sq > Sk)
      {MaskKind::none, {2, -1}, 5, 3, {{0, 3}, {0, 3}, {0, 3}, {0, 3}, {0, 3}}},
      // left 0 only, Sq > Sk: d = −2, keys from i − 2 on; rows 0 .. 2 see all
      {MaskKind::none, {0, -1}, 5, 3, {{0, 3}, {0, 3}, {0, 3}, {1, 3}, {2, 3}}},
      // right 0 only, Sq > Sk: the bottom-right causal mask
      {MaskKind::none, {-1, 0}, 5, 3, {{0, 0}, {0, 0}, {0, 1}, {0, 2}, {0, 3}}},
      // causal Sq > Sk with left 1: leading rows see nothing
      {MaskKind::causal, {1, 0}, 5, 3, {{0, 0}, {0, 0}, {0, 1}, {0, 2}, {1, 3}}},
      // top-left, left 2, Sq > Sk: d = 0, rows past Sk + 1 see nothing
      {MaskKind::causal_top_left, {2, -1}, 6, 3, {{0, 1}, {0, 2}, {0, 3}, {1, 3}, {2, 3}, {3, 3}}},
  };
  constexpr std::int64_t kD = 5;
  constexpr double kScale = 0.8;
  for (std::size_t ci = 0; ci < cases.size(); ++ci) {
    const WindowCase& c = cases[ci];
    SCOPED_TRACE("case " + std::to_string(ci));
    const AttentionShape s = make_shape(1, 1, 1, c.Sq, c.Sk, kD);
    const Problem p = random_problem(s, 41 + ci);
    const ForwardResult r = forward(s, p.q, p.k, p.v, c.mask, kScale, c.window);
    for (std::int64_t i = 0; i < c.Sq; ++i) {
      const auto [first, end] = c.keys_per_row[i];
      for (std::int64_t j = 0; j < c.Sk; ++j)
        EXPECT_EQ(visible(c.mask, c.window, c.Sq, c.Sk, i, j), j >= first && j < end) << i << "," << j;
      const double* o_row = r.o.data() + i * kD;
      if (end <= first) {
        EXPECT_EQ(r.lse[i], kNegInf);
        for (std::int64_t d = 0; d < kD; ++d) EXPECT_EQ(o_row[d], 0.0);
        continue;
      }
      const AttentionShape one = make_shape(1, 1, 1, 1, end - first, kD);
      const std::vector<double> q_row(p.q.begin() + i * kD, p.q.begin() + (i + 1) * kD);
      const std::vector<double> k_keys(p.k.begin() + first * kD, p.k.begin() + end * kD);
      const std::vector<double> v_keys(p.v.begin() + first * kD, p.v.begin() + end * kD);
      const ForwardResult e = forward(one, q_row, k_keys, v_keys, MaskKind::none, kScale);
      EXPECT_NEAR(r.lse[i], e.lse[0], kRoundoffTol) << "row " << i;
      for (std::int64_t d = 0; d < kD; ++d) EXPECT_NEAR(o_row[d], e.o[d], kRoundoffTol) << "row " << i;
    }
  }
}

// ---- GQA / MQA -------------------------------------------------------------

// K or V with each key/value head repeated for every query head of its group.
std::vector<double> repeat_heads(const std::vector<double>& x, const AttentionShape& s) {
  std::vector<double> out(s.B * s.Sk * s.Hq * s.D);
  for (std::int64_t b = 0; b < s.B; ++b)
    for (std::int64_t j = 0; j < s.Sk; ++j)
      for (std::int64_t h = 0; h < s.Hq; ++h)
        for (std::int64_t d = 0; d < s.D; ++d)
          out[bshd_index(s.Sk, s.Hq, s.D, b, j, h, d)] = x[bshd_index(s.Sk, s.Hkv, s.D, b, j, h / s.group(), d)];
  return out;
}

// dK of repeated heads, summed back over each group.
std::vector<double> sum_groups(const std::vector<double>& x, const AttentionShape& s) {
  std::vector<double> out(s.kv_elems(), 0.0);
  for (std::int64_t b = 0; b < s.B; ++b)
    for (std::int64_t j = 0; j < s.Sk; ++j)
      for (std::int64_t h = 0; h < s.Hq; ++h)
        for (std::int64_t d = 0; d < s.D; ++d)
          out[bshd_index(s.Sk, s.Hkv, s.D, b, j, h / s.group(), d)] += x[bshd_index(s.Sk, s.Hq, s.D, b, j, h, d)];
  return out;
}

TEST(ReferenceGqa, EqualsAttentionWithKeyValueHeadsRepeated) {
  for (std::int64_t hkv : {1, 2}) {  // MQA and GQA with groups of 3
    SCOPED_TRACE("Hkv=" + std::to_string(hkv));
    const AttentionShape s = make_shape(2, 6, hkv, 5, 8, 7);
    AttentionShape full = s;
    full.Hkv = s.Hq;
    const Problem p = random_problem(s, 41 + hkv);
    const std::vector<double> d_o = random_vector(s.q_elems(), 45);
    const std::vector<double> k_rep = repeat_heads(p.k, s), v_rep = repeat_heads(p.v, s);

    const ForwardResult g = forward(s, p.q, p.k, p.v, MaskKind::causal, 0.0);
    const ForwardResult r = forward(full, p.q, k_rep, v_rep, MaskKind::causal, 0.0);
    expect_all_near(g.o, r.o, kRoundoffTol, "O");
    expect_all_near(g.lse, r.lse, kRoundoffTol, "LSE");

    const BackwardResult gb = backward(s, p.q, p.k, p.v, d_o, MaskKind::causal, 0.0);
    const BackwardResult rb = backward(full, p.q, k_rep, v_rep, d_o, MaskKind::causal, 0.0);
    expect_all_near(gb.dq, rb.dq, kRoundoffTol, "dQ");
    expect_all_near(gb.dk, sum_groups(rb.dk, s), kRoundoffTol, "dK");
    expect_all_near(gb.dv, sum_groups(rb.dv, s), kRoundoffTol, "dV");
  }
}

// ---- Key-shift invariance (what smooth_k relies on) ----------------------------

// Adding c to every key adds scale·q·c to a whole score row: P, O and all
// gradients are unchanged, and LSE moves by exactly scale·q·c.
TEST(ReferenceShift, AddingAVectorToEveryKeyOnlyShiftsLse) {
  for (MaskKind mask : {MaskKind::none, MaskKind::causal}) {
    SCOPED_TRACE(mask == MaskKind::none ? "noncausal" : "causal");
    const AttentionShape s = make_shape(2, 4, 2, 6, 5, 8);  // Sq > Sk: causal has masked rows
    const double scale = 0.6;
    const Problem p = random_problem(s, 51);
    const std::vector<double> d_o = random_vector(s.q_elems(), 55);
    // A mean-like offset per (b, kv head), larger than the keys themselves.
    const std::vector<double> c = random_vector(s.B * s.Hkv * s.D, 57);
    constexpr double kOffsetSize = 3.0;
    std::vector<double> k_shifted = p.k;
    for (std::int64_t b = 0; b < s.B; ++b)
      for (std::int64_t j = 0; j < s.Sk; ++j)
        for (std::int64_t h = 0; h < s.Hkv; ++h)
          for (std::int64_t d = 0; d < s.D; ++d)
            k_shifted[bshd_index(s.Sk, s.Hkv, s.D, b, j, h, d)] += kOffsetSize * c[(b * s.Hkv + h) * s.D + d];

    const ForwardResult base = forward(s, p.q, p.k, p.v, mask, scale);
    const ForwardResult shifted = forward(s, p.q, k_shifted, p.v, mask, scale);
    expect_all_near(shifted.o, base.o, kRoundoffTol, "O");
    std::vector<double> lse_expected = base.lse;
    for (std::int64_t b = 0; b < s.B; ++b)
      for (std::int64_t h = 0; h < s.Hq; ++h)
        for (std::int64_t i = 0; i < s.Sq; ++i) {
          double qc = 0.0;
          for (std::int64_t d = 0; d < s.D; ++d)
            qc += p.q[bshd_index(s.Sq, s.Hq, s.D, b, i, h, d)] * kOffsetSize * c[(b * s.Hkv + h / s.group()) * s.D + d];
          lse_expected[(b * s.Hq + h) * s.Sq + i] += scale * qc;
        }
    expect_all_near(shifted.lse, lse_expected, kRoundoffTol, "LSE");

    const BackwardResult gb = backward(s, p.q, p.k, p.v, d_o, mask, scale);
    const BackwardResult gs = backward(s, p.q, k_shifted, p.v, d_o, mask, scale);
    expect_all_near(gs.dq, gb.dq, kRoundoffTol, "dQ");
    expect_all_near(gs.dk, gb.dk, kRoundoffTol, "dK");
    expect_all_near(gs.dv, gb.dv, kRoundoffTol, "dV");
  }
}

// ---- Finite-difference gradients ---------------------------------------------

// Central differences have O(h²) truncation and O(ε/h) rounding error; h = 1e-5
// puts both near 1e-10, far below the 1e-6 bound.
constexpr double kFdStep = 1e-5;
constexpr double kFdRelTol = 1e-6;

struct GradCase {
  std::string name;
  AttentionShape shape;
  MaskKind mask;
  double scale;
  Window window{};
};

// L = Σ O ⊙ G, so dL/dO = G and backward(dO = G) must be the gradient of L.
double loss(const GradCase& c, const Problem& p, const std::vector<double>& g) {
  const ForwardResult r = forward(c.shape, p.q, p.k, p.v, c.mask, c.scale, c.window);
  double l = 0.0;
  for (std::size_t i = 0; i < g.size(); ++i) l += r.o[i] * g[i];
  return l;
}

// ‖finite difference − analytic‖ / ‖analytic‖ for one input tensor.
double gradient_error(const GradCase& c, Problem& p, std::vector<double>& x, const std::vector<double>& g,
                      const std::vector<double>& analytic) {
  std::vector<double> diff(x.size());
  for (std::size_t e = 0; e < x.size(); ++e) {
    const double saved = x[e];
    x[e] = saved + kFdStep;
    const double up = loss(c, p, g);
    x[e] = saved - kFdStep;
    const double down = loss(c, p, g);
    x[e] = saved;
    diff[e] = (up - down) / (2 * kFdStep) - analytic[e];
  }
  return l2_norm(diff) / l2_norm(analytic);
}

TEST(ReferenceBackward, MatchesCentralFiniteDifferences) {
  const std::vector<GradCase> cases = {
      {"noncausal", make_shape(2, 2, 2, 4, 5, 6), MaskKind::none, 0.7},
      {"causal Sq>Sk", make_shape(1, 2, 2, 6, 4, 5), MaskKind::causal, 0.0},
      {"causal Sq<Sk", make_shape(1, 2, 1, 3, 6, 5), MaskKind::causal, 0.9},
      {"causal top-left", make_shape(1, 2, 2, 5, 3, 4), MaskKind::causal_top_left, 0.0},
      {"GQA", make_shape(2, 4, 2, 4, 5, 3), MaskKind::none, 1.3},
      {"causal window", make_shape(1, 2, 1, 6, 6, 4), MaskKind::causal, 0.0, {2, -1}},
      {"two-sided window Sq<Sk", make_shape(1, 2, 2, 4, 7, 3), MaskKind::none, 0.8, {1, 2}},
      {"left window Sq>Sk", make_shape(2, 2, 1, 6, 4, 3), MaskKind::none, 0.0, {1, -1}},
  };
  std::uint64_t seed = 61;
  for (const GradCase& c : cases) {
    SCOPED_TRACE(c.name);
    Problem p = random_problem(c.shape, seed);
    const std::vector<double> g = random_vector(c.shape.q_elems(), seed + 3);
    seed += 10;
    const BackwardResult grad = backward(c.shape, p.q, p.k, p.v, g, c.mask, c.scale, c.window);
    // A zero gradient would make the relative check meaningless.
    ASSERT_GT(l2_norm(grad.dq), 0.0);
    ASSERT_GT(l2_norm(grad.dk), 0.0);
    ASSERT_GT(l2_norm(grad.dv), 0.0);
    EXPECT_LT(gradient_error(c, p, p.q, g, grad.dq), kFdRelTol) << "dQ";
    EXPECT_LT(gradient_error(c, p, p.k, g, grad.dk), kFdRelTol) << "dK";
    EXPECT_LT(gradient_error(c, p, p.v, g, grad.dv), kFdRelTol) << "dV";
  }
}

// Fully masked rows: O there is the constant 0, so they add nothing to any gradient.
TEST(ReferenceBackward, FullyMaskedRowsContributeNothing) {
  const AttentionShape s = make_shape(1, 1, 1, 5, 3, 4);
  const Problem p = random_problem(s, 71);
  std::vector<double> d_o = random_vector(s.q_elems(), 73);
  const BackwardResult base = backward(s, p.q, p.k, p.v, d_o, MaskKind::causal, 0.0);
  const std::int64_t masked_rows = s.Sq - s.Sk;
  for (std::int64_t e = 0; e < masked_rows * s.D; ++e) {
    EXPECT_EQ(base.dq[e], 0.0);
    d_o[e] *= -7.0;  // a different upstream gradient on masked rows must change nothing
  }
  const BackwardResult changed = backward(s, p.q, p.k, p.v, d_o, MaskKind::causal, 0.0);
  EXPECT_EQ(changed.dq, base.dq);
  EXPECT_EQ(changed.dk, base.dk);
  EXPECT_EQ(changed.dv, base.dv);
}

// ---- Bad input ---------------------------------------------------------------

void expect_error_naming(const std::function<void()>& call, const std::string& argument) {
  try {
    call();
    ADD_FAILURE() << "no fp4attn::Error for " << argument;
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), argument) << e.what();
  }
}

TEST(ReferenceErrors, BadInputNamesTheArgument) {
  const AttentionShape s = make_shape(1, 4, 2, 3, 5, 8);
  const Problem p = random_problem(s, 81);
  const std::vector<double> d_o = random_vector(s.q_elems(), 83);
  const std::vector<double> short_q(p.q.begin(), p.q.end() - 1);
  const std::vector<double> long_kv(s.kv_elems() + 1, 0.5);
  const double nan = std::numeric_limits<double>::quiet_NaN();
  expect_error_naming([&] { forward(s, short_q, p.k, p.v, MaskKind::none, 0.0); }, "q");
  expect_error_naming([&] { forward(s, p.q, long_kv, p.v, MaskKind::none, 0.0); }, "k");
  expect_error_naming([&] { forward(s, p.q, p.k, long_kv, MaskKind::none, 0.0); }, "v");
  expect_error_naming([&] { forward(s, p.q, p.k, p.v, MaskKind::none, nan); }, "scale");
  expect_error_naming([&] { backward(s, p.q, p.k, p.v, short_q, MaskKind::none, 0.0); }, "d_o");
  expect_error_naming([&] { backward(s, p.q, long_kv, p.v, d_o, MaskKind::causal, 0.0); }, "k");

  AttentionShape uneven = s;
  uneven.Hkv = 3;
  expect_error_naming([&] { forward(uneven, p.q, p.k, p.v, MaskKind::none, 0.0); }, "Hq");
  expect_error_naming([&] { backward(uneven, p.q, p.k, p.v, d_o, MaskKind::none, 0.0); }, "Hq");

  using Field = std::int64_t AttentionShape::*;
  const std::vector<std::pair<Field, std::string>> sizes = {
      {&AttentionShape::B, "B"},   {&AttentionShape::Hq, "Hq"}, {&AttentionShape::Hkv, "Hkv"},
      {&AttentionShape::Sq, "Sq"}, {&AttentionShape::Sk, "Sk"}, {&AttentionShape::D, "D"}};
  for (const auto& [field, name] : sizes)
    for (std::int64_t bad_value : {0, -1}) {
      AttentionShape bad = s;
      bad.*field = bad_value;
      expect_error_naming([&] { forward(bad, p.q, p.k, p.v, MaskKind::none, 0.0); }, name);
    }
}

}  // namespace
}  // namespace fp4attn::reference
