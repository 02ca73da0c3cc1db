// Preconditions the emulator relies on for memory safety and for its tiling
// rules. The public entry points validate once in dispatch/; these checks keep
// direct callers (tests, tools) from indexing out of bounds.
#pragma once


#include "fp4attn/recipe.hpp"
#include "fp4attn/tensor.hpp"

namespace fp4attn::emulator {

// Throws fp4attn::Error naming the offending argument.
void check_problem(const AttentionShape& shape, const AttentionOptions& opt);

}  // namespace fp4attn::emulator
