// The default problem of `fp4attn run`: random inputs shaped like real
// attention activations, reproducible from a seed on every platform.
#pragma once

#include <cstdint>

#include "report.hpp"

namespace fp4attn::cli {

Problem make_synthetic(const AttentionShape& shape, MaskKind mask, std::uint64_t seed);

}  // namespace fp4attn::cli
