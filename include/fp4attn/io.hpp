// Readers for tensors stored by numpy (.npy) and safetensors (.safetensors),
// so users can measure accuracy on their own activations. Every malformed
// input throws fp4attn::Error naming its source; nothing is read out of bounds.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace fp4attn::io {

// Element types the readers accept; all are widened to float exactly.
enum class DType : std::uint8_t { f32, f16, bf16 };

constexpr std::string_view to_string(DType t) {
  switch (t) {
    case DType::f32: return "float32";
    case DType::f16: return "float16";
    case DType::bf16: return "bfloat16";
  }
  return "?";
}

struct HostTensor {
  std::vector<std::int64_t> shape;  // C order, outermost first; empty for a scalar
  std::vector<float> data;          // product(shape) elements
  DType dtype = DType::f32;         // how the values were stored
  std::string name;                 // safetensors key; empty for .npy
};

// `source` names the input in errors, e.g. "file 'q.npy'".
//
// .npy versions 1-3, little-endian '<f4' and '<f2', and '<V2' read as
// bfloat16 (how ml_dtypes saves its bfloat16 arrays: numpy records only a
// 2-byte opaque type). C order only.
HostTensor parse_npy(std::span<const std::uint8_t> bytes, const std::string& source = "npy data");

// .safetensors with dtypes F32, F16 and BF16. `key` picks a tensor; empty
// picks the only tensor and is an error when there are several.
HostTensor parse_safetensors(std::span<const std::uint8_t> bytes, const std::string& key = "",
                             const std::string& source = "safetensors data");

// Whole file as bytes; missing or unreadable files throw naming the path.
std::vector<std::uint8_t> read_file(const std::string& path);

// Reads a .npy or .safetensors file, chosen by extension. `key` applies to
// safetensors only (an error for .npy).
HostTensor read_tensor(const std::string& path, const std::string& key = "");

}  // namespace fp4attn::io
