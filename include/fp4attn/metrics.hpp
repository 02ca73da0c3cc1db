// Error metrics between a result and a reference, as the tests, the CLI and
// docs/accuracy.md report them.
#pragma once

#include <cstdint>
#include <span>

namespace fp4attn {

struct ErrorMetrics {
  double cosine = 1.0;   // cosine similarity of the finite positions
  double rel_l2 = 0.0;   // ||got - ref||_2 / ||ref||_2
  double rel_l1 = 0.0;   // ||got - ref||_1 / ||ref||_1
  double max_abs = 0.0;  // max |got - ref|
  std::int64_t nonfinite_mismatch = 0;  // positions whose NaN/Inf-ness differs
};

// Positions where both values are finite feed the four norms; a position where
// exactly one side is non-finite, or where both are infinite with different
// signs or one is NaN and the other infinite, counts as a mismatch instead.
// Throws fp4attn::Error when the sizes differ.
ErrorMetrics compare(std::span<const float> got, std::span<const double> ref);
ErrorMetrics compare(std::span<const float> got, std::span<const float> ref);

}  // namespace fp4attn
