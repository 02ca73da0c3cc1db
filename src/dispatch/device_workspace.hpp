// What the zero-copy device entry points (sm90_device_cuda.cpp,
// sm90_backward_cuda.cpp) share: carving the caller's workspace into aligned
// regions, checking it, and turning device tensor views into quantizer inputs.
// Included by CUDA-build sources only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "cuda/quantize/quantize_fp8.hpp"
#include "dispatch/sm90_executor.hpp"
#include "fp4attn/error.hpp"

namespace fp4attn::dispatch {

// Every workspace region starts on this boundary (cudaMalloc's own alignment).
inline constexpr std::size_t kWorkspaceAlign = 256;

// Hands out consecutive aligned regions; `bytes()` is the total so far.
class WorkspaceRegions {
 public:
  std::size_t take(std::size_t bytes) {
    const std::size_t offset = at_;
    at_ += (bytes + kWorkspaceAlign - 1) / kWorkspaceAlign * kWorkspaceAlign;
    return offset;
  }
  std::size_t bytes() const { return at_; }

 private:
  std::size_t at_ = 0;
};

// Throws fp4attn::Error("workspace", ...) unless `workspace` holds `needed` bytes on the alignment.
inline void check_workspace(const void* workspace, std::size_t given, std::size_t needed) {
  if (workspace == nullptr || given < needed)
    throw Error("workspace", "needs " + std::to_string(needed) + " device bytes, got " +
                                 std::to_string(workspace == nullptr ? 0 : given));
  if (reinterpret_cast<std::uintptr_t>(workspace) % kWorkspaceAlign != 0)
    throw Error("workspace", "must be " + std::to_string(kWorkspaceAlign) + "-byte aligned");
}

inline cuda_quantize::ElementType element_type(DeviceElement e) {
  switch (e) {
    case DeviceElement::f32: return cuda_quantize::ElementType::f32;
    case DeviceElement::f16: return cuda_quantize::ElementType::f16;
    case DeviceElement::bf16: return cuda_quantize::ElementType::bf16;
  }
  throw Error("dtype", "unknown device element type");
}

// The quantizer's view of a (B, S, H, D) device tensor; `name` names a null pointer.
inline cuda_quantize::StridedInput strided(const DeviceTensorView& x, DeviceElement e, std::int64_t B, std::int64_t S,
                                           std::int64_t H, std::int64_t D, const char* name) {
  if (x.data == nullptr) throw Error(name, "is a null device pointer");
  return {x.data, element_type(e), B, S, H, D, x.stride_b, x.stride_s, x.stride_h};
}

}  // namespace fp4attn::dispatch
