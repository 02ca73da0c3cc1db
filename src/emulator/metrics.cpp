// Error metrics: accumulated in double so that the metric itself adds no
// error visible next to the fp32/bf16 results it judges.
#include "fp4attn/metrics.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "fp4attn/error.hpp"

namespace fp4attn {
namespace {

// Two non-finite values match when both are NaN or both are the same infinity
// (a fully masked row's LSE is -inf on both sides).
bool nonfinite_match(double a, double b) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  return a == b;
}

template <typename Ref>
ErrorMetrics compare_impl(std::span<const float> got, std::span<const Ref> ref) {
  if (got.size() != ref.size())
    throw Error("got", "has " + std::to_string(got.size()) + " elements, reference has " +
                           std::to_string(ref.size()));
  double dot = 0, got_sq = 0, ref_sq = 0, diff_sq = 0, diff_abs = 0, ref_abs = 0, max_abs = 0;
  std::int64_t mismatch = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double g = got[i];
    const double r = static_cast<double>(ref[i]);
    const bool g_finite = std::isfinite(g), r_finite = std::isfinite(r);
    if (!g_finite || !r_finite) {
      if (g_finite || r_finite || !nonfinite_match(g, r)) ++mismatch;
      continue;
    }
    const double diff = g - r;
    dot += g * r;
    got_sq += g * g;
    ref_sq += r * r;
    diff_sq += diff * diff;
    diff_abs += std::abs(diff);
    ref_abs += std::abs(r);
    max_abs = std::max(max_abs, std::abs(diff));
  }
  ErrorMetrics m;
  m.nonfinite_mismatch = mismatch;
  m.max_abs = max_abs;
  // Two all-zero vectors are identical: cosine 1, relative errors 0. A zero
  // reference against a non-zero result has no finite relative error.
  if (got_sq == 0 && ref_sq == 0) return m;
  m.cosine = (got_sq > 0 && ref_sq > 0) ? dot / std::sqrt(got_sq * ref_sq) : 0.0;
  m.rel_l2 = ref_sq > 0 ? std::sqrt(diff_sq / ref_sq) : std::numeric_limits<double>::infinity();
  m.rel_l1 = ref_abs > 0 ? diff_abs / ref_abs : std::numeric_limits<double>::infinity();
  return m;
}

}  // namespace

ErrorMetrics compare(std::span<const float> got, std::span<const double> ref) { return compare_impl(got, ref); }
ErrorMetrics compare(std::span<const float> got, std::span<const float> ref) { return compare_impl(got, ref); }

}  // namespace fp4attn
