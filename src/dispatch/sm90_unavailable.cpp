// Stand-ins for the sm90 executor in a build without CUDA: no device is ever
// present, and asking for the executor explicitly is an error for the caller.
#if !defined(FP4ATTN_HAS_CUDA)

#include "dispatch/sm90_executor.hpp"
#include "fp4attn/error.hpp"

namespace fp4attn::dispatch {

ForwardOutput sm90_forward(const AttentionShape&, std::span<const float>, std::span<const float>,
                           std::span<const float>, const AttentionOptions&) {
  throw Error("executor", "this build has no CUDA executors");
}

ForwardOutput sm90_forward_e4m3(const AttentionShape&, const E4m3Inputs&, const AttentionOptions&) {
  throw Error("executor", "this build has no CUDA executors");
}

bool sm90_device_present() { return false; }

Sm90Benchmark sm90_benchmark(const AttentionShape&, const BenchOptions&) {
  throw Error("executor", "this build has no CUDA executors");
}

std::size_t sm90_device_workspace_bytes(const AttentionShape&, Recipe, PackedTokens) { return 0; }

std::size_t sm90_device_saved_bytes(const AttentionShape&, Recipe, PackedTokens) { return 0; }

std::size_t sm90_device_saved_k_mean_offset(const AttentionShape&, Recipe, PackedTokens) { return 0; }

void sm90_forward_device(const DeviceForwardArgs&, const AttentionOptions&, void*) {
  throw Error("executor", "this build has no CUDA executors");
}

std::size_t sm90_device_e4m3_workspace_bytes(const AttentionShape&, PackedTokens) { return 0; }

void sm90_forward_device_e4m3(const DeviceE4m3ForwardArgs&, const AttentionOptions&, void*) {
  throw Error("executor", "this build has no CUDA executors");
}

std::size_t sm90_device_backward_workspace_bytes(const AttentionShape&, bool, Recipe, bool, PackedTokens) { return 0; }

void sm90_backward_device(const DeviceBackwardArgs&, const AttentionOptions&, bool, void*) {
  throw Error("executor", "this build has no CUDA executors");
}

bool sm90_backward_supports(const AttentionShape&, const AttentionOptions&) { return false; }

BackwardOutput sm90_backward(const AttentionShape&, std::span<const float>, std::span<const float>,
                             std::span<const float>, std::span<const float>, std::span<const float>,
                             std::span<const float>, const AttentionOptions&) {
  throw Error("executor", "this build has no CUDA executors");
}

}  // namespace fp4attn::dispatch

#endif  // !FP4ATTN_HAS_CUDA
