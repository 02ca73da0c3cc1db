// Shapes of attention problems and a small owning 4-D array for host code.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "fp4attn/recipe.hpp"

namespace fp4attn {

// Sizes of one attention call. Tensors are (B, S, H, D), D contiguous.
struct AttentionShape {
  std::int64_t B = 1;
  std::int64_t Hq = 1;
  std::int64_t Hkv = 1;
  std::int64_t Sq = 1;
  std::int64_t Sk = 1;
  std::int64_t D = 64;

  std::int64_t q_elems() const { return B * Sq * Hq * D; }
  std::int64_t kv_elems() const { return B * Sk * Hkv * D; }
  std::int64_t lse_elems() const { return B * Hq * Sq; }
  std::int64_t group() const { return Hq / Hkv; }  // query heads per key/value head
};

// Throws fp4attn::Error naming the argument: a size that is not positive, or
// Hq not a multiple of Hkv.
void check_shape(const AttentionShape& shape);
// Throws fp4attn::Error naming window_left or window_right: a bound below -1,
// or a right bound past the diagonal with a causal mask.
void check_window(MaskKind mask, Window window);
// Throws fp4attn::Error naming `name` when a tensor's element count is not the shape's.
void check_element_count(std::size_t actual, std::int64_t expected, const char* name);

// Rows of d values (a tensor whose last dim is d) to rows of d_to ≥ d, zeros
// appended: a head dim run on a wider one. Zero channels change no bit of O's
// first d columns, the LSE or the gradients, given the softmax scale of d
// (tests EmulatorForward.ZeroChannelsChangeNoBit and its backward twin).
std::vector<float> append_zero_channels(std::span<const float> x, std::int64_t d, std::int64_t d_to);
// Rows of d_from values to their first d.
std::vector<float> first_channels(std::span<const float> x, std::int64_t d_from, std::int64_t d);

// Index into a contiguous (B, S, H, D) tensor.
inline std::int64_t bshd_index(std::int64_t S, std::int64_t H, std::int64_t D, std::int64_t b, std::int64_t s,
                               std::int64_t h, std::int64_t d) {
  return ((b * S + s) * H + h) * D + d;
}

}  // namespace fp4attn
