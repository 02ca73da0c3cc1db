// Public entry points: attention on host arrays, run by the best executor
// available (the sm90 kernels on a Hopper GPU, else the CPU emulator).
#pragma once

#include <span>
#include <string>
#include <vector>

#include "fp4attn/recipe.hpp"
#include "fp4attn/tensor.hpp"

namespace fp4attn {

enum class Executor : std::uint8_t { automatic, emulator, sm90 };

constexpr std::string_view to_string(Executor e) {
  switch (e) {
    case Executor::automatic: return "automatic";
    case Executor::emulator: return "emulator";
    case Executor::sm90: return "sm90";
  }
  return "?";
}

struct ForwardOutput {
  std::vector<float> o;    // (B, Sq, Hq, D), bf16-rounded values
  std::vector<float> lse;  // (B, Hq, Sq), natural log
  Executor executor = Executor::emulator;
};

// Throws fp4attn::Error naming the bad argument (shape, heads, head dim,
// options). Called once by every entry point; kernels and bindings trust it.
void validate(const AttentionShape& shape, const AttentionOptions& opt);

// Throws fp4attn::Error when q, k or v has the wrong element count for `shape`.
void validate_sizes(const AttentionShape& shape, std::size_t q_size, std::size_t k_size, std::size_t v_size);

// Head dims: the emulator takes any multiple of 32 in [32, 256] (its scale
// blocks are 32 wide); the sm90 kernels are instantiated for these only.
inline constexpr int kHeadDimStep = 32;
inline constexpr int kMinHeadDim = 32;
inline constexpr int kMaxHeadDim = 256;
inline constexpr int kSm90HeadDims[] = {64, 128};
bool emulator_supports_head_dim(std::int64_t d);
// Whether the sm90 executor implements this (already validated) problem:
// its target, recipe, tile sizes and head dim.
bool sm90_supports(const AttentionShape& shape, const AttentionOptions& opt);

// True when this library was built with the CUDA executors.
bool cuda_built();
// True when this build has the sm90 executor and a compute-capability 9.0 GPU is present.
bool sm90_available();
// One line on the device (or its absence) for `fp4attn info` and `fp4attn run`.
std::string device_description();

ForwardOutput forward(const AttentionShape& shape, std::span<const float> q, std::span<const float> k,
                      std::span<const float> v, const AttentionOptions& opt, Executor executor = Executor::automatic);

}  // namespace fp4attn
