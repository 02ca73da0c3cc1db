// TMA tensor maps for byte tensors, encoded through the driver entry point
// that the CUDA runtime hands out, so nothing links against libcuda.
#pragma once

#include <cuda.h>

#include <array>
#include <cstdint>
#include <string>

namespace fp4attn::sm90 {

// none: the box lands densely, rows one after another (staging buffers that
// ordinary loads read, not wgmma).
enum class TmaSwizzle : std::uint8_t { none, b64, b128 };

// A rank-4 tensor of one-byte elements: dims innermost first, byte strides of
// dims 1..3 (each a multiple of 16), box = the tile one TMA copy moves.
// Out-of-range elements of a box read as zero. `name` is used in errors.
CUtensorMap make_byte_tensor_map(const void* base, const std::array<std::uint64_t, 4>& dims,
                                 const std::array<std::uint64_t, 3>& byte_strides,
                                 const std::array<std::uint32_t, 4>& box, TmaSwizzle swizzle, const std::string& name);

}  // namespace fp4attn::sm90
