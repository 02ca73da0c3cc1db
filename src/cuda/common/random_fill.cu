// Counter-based normal samples: a SplitMix64 hash of (seed, index) gives two
// uniforms, Box–Muller turns them into one normal sample.
#include <cuda_bf16.h>

#include <algorithm>

#include "cuda/common/device_memory.hpp"
#include "cuda/common/random_fill.hpp"

namespace fp4attn::cuda_common {
namespace {

constexpr int kThreads = 256;
constexpr std::int64_t kMaxBlocks = 4096;  // grid-stride beyond this: enough blocks to fill any GPU
// (k + 1/2)·2⁻²³ for k < 2²³ needs 24 significant bits: exact in a float,
// strictly inside (0, 1), and so is 2·u exact and never an odd multiple of 1/2.
constexpr int kUniformBits = 23;
constexpr float kUniformStep = 1.0f / (1 << kUniformBits);
constexpr std::uint64_t kUniformMask = (1ull << kUniformBits) - 1;
constexpr std::uint64_t kGolden = 0x9E3779B97F4A7C15ull;  // SplitMix64's increment

// SplitMix64 output mix, shifts and multipliers as published (Steele et al., 2014).
__device__ std::uint64_t splitmix64(std::uint64_t x) {
  x += kGolden;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

__global__ void fill_normal_bf16_kernel(__nv_bfloat16* out, std::int64_t n, std::uint64_t seed) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const std::uint64_t h = splitmix64(seed * kGolden + static_cast<std::uint64_t>(i));
    // u1, u2 strictly inside (0, 1): the log is finite and non-zero, and the
    // cosine never hits a zero, so every sample is non-zero, as in real
    // activations.
    const float u1 = (static_cast<float>((h >> kUniformBits) & kUniformMask) + 0.5f) * kUniformStep;
    const float u2 = (static_cast<float>(h & kUniformMask) + 0.5f) * kUniformStep;
    out[i] = __float2bfloat16_rn(sqrtf(-2.0f * logf(u1)) * cospif(2.0f * u2));
  }
}

}  // namespace

void fill_normal_bf16(std::uint16_t* out, std::int64_t n, std::uint64_t seed, cudaStream_t stream) {
  const std::int64_t blocks = std::min<std::int64_t>((n + kThreads - 1) / kThreads, kMaxBlocks);
  if (blocks == 0) return;
  fill_normal_bf16_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
      reinterpret_cast<__nv_bfloat16*>(out), n, seed);
  check_cuda(cudaGetLastError(), "fill_normal_bf16 launch");
}

}  // namespace fp4attn::cuda_common
