// The shape checks every executor shares: sizes positive, heads grouped,
// element counts matching. One copy, so every entry point words them alike.
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

void check_element_count(std::size_t actual, std::int64_t expected, const char* name) {
  if (actual != static_cast<std::size_t>(expected))
    throw Error(name, "has " + std::to_string(actual) + " elements, the shape needs " + std::to_string(expected));
}

}  // namespace fp4attn
