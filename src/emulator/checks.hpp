// Preconditions the emulator relies on for memory safety and for its tiling
// rules. The public entry points validate once in dispatch/; these checks keep
// direct callers (tests, tools) from indexing out of bounds.
#pragma once

#include <span>

#include "fp4attn/recipe.hpp"
#include "fp4attn/tensor.hpp"

namespace fp4attn::emulator {

// Throws fp4attn::Error naming the offending argument.
void check_problem(const AttentionShape& shape, const AttentionOptions& opt);

// The problem a head dim that is no multiple of kChannelBlock runs as: zero
// channels appended up to one (append_zero_channels says why no bit changes),
// at the softmax scale of the unpadded D. Checks the shape and q, k, v's sizes.
struct ChannelPadded {
  AttentionShape shape;
  AttentionOptions opt;
};
ChannelPadded channel_padded(const AttentionShape& shape, const AttentionOptions& opt, std::span<const float> q,
                             std::span<const float> k, std::span<const float> v);

}  // namespace fp4attn::emulator
