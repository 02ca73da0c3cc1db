// The shape checks every executor shares: sizes positive, heads grouped,
// element counts matching. One copy, so every entry point words them alike.
// Also the zero channels that run a head dim on a wider one.
#include <algorithm>
#include <string>

#include "fp4attn/error.hpp"
#include "fp4attn/tensor.hpp"

namespace fp4attn {
namespace {

void require_positive(std::int64_t value, const char* name) {
  if (value <= 0) throw Error(name, "must be > 0, got " + std::to_string(value));
}

}  // namespace

void check_shape(const AttentionShape& shape) {
  require_positive(shape.B, "B");
  require_positive(shape.Hq, "Hq");
  require_positive(shape.Hkv, "Hkv");
  require_positive(shape.Sq, "Sq");
  require_positive(shape.Sk, "Sk");
  require_positive(shape.D, "D");
  if (shape.Hq % shape.Hkv != 0)
    throw Error("Hq", "Hq (" + std::to_string(shape.Hq) + ") must be a multiple of Hkv (" +
                          std::to_string(shape.Hkv) + ")");
}

void check_window(MaskKind mask, Window window) {
  if (window.left < -1)
    throw Error("window_left", "must be -1 (no bound) or >= 0, got " + std::to_string(window.left));
  if (window.right < -1)
    throw Error("window_right", "must be -1 (no bound) or >= 0, got " + std::to_string(window.right));
  if (mask != MaskKind::none && window.right > 0)
    throw Error("window_right", "must be -1 or 0 with a causal mask (it ends every row at its diagonal), got " +
                                    std::to_string(window.right));
}

void check_element_count(std::size_t actual, std::int64_t expected, const char* name) {
  if (actual != static_cast<std::size_t>(expected))
    throw Error(name, "has " + std::to_string(actual) + " elements, the shape needs " + std::to_string(expected));
}

std::vector<float> append_zero_channels(std::span<const float> x, std::int64_t d, std::int64_t d_to) {
  const std::size_t rows = x.size() / static_cast<std::size_t>(d);
  std::vector<float> out(rows * static_cast<std::size_t>(d_to), 0.0f);
  for (std::size_t r = 0; r < rows; ++r)
    std::copy_n(x.begin() + static_cast<std::ptrdiff_t>(r * d), d, out.begin() + static_cast<std::ptrdiff_t>(r * d_to));
  return out;
}

std::vector<float> first_channels(std::span<const float> x, std::int64_t d_from, std::int64_t d) {
  const std::size_t rows = x.size() / static_cast<std::size_t>(d_from);
  std::vector<float> out(rows * static_cast<std::size_t>(d));
  for (std::size_t r = 0; r < rows; ++r)
    std::copy_n(x.begin() + static_cast<std::ptrdiff_t>(r * d_from), d, out.begin() + static_cast<std::ptrdiff_t>(r * d));
  return out;
}

}  // namespace fp4attn
