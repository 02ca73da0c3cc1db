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

// Where a recipe-fp8 forward leaves Q's and K's quantized operands for the
// backward (DeviceForwardArgs::saved, DeviceBackwardArgs::saved): the codes
// and block scales the backward's first quantizer call would compute again,
// the transposed copies its gradient products read, the smooth_k mean and
// LSE shift, and the forward quantizer's non-finite flags (q, k, v). One
// layout for both sides.
inline constexpr int kSavedFlags = 3;

struct SavedLayout {
  std::size_t q, k, qt, kt, q_scale, k_scale, k_mean, lse_shift, nonfinite, bytes;
};

inline SavedLayout saved_layout(const AttentionShape& s) {
  const auto floats = [](std::int64_t n) { return static_cast<std::size_t>(n) * sizeof(float); };
  const auto bytes = [](std::int64_t n) { return static_cast<std::size_t>(n); };
  const std::int64_t pq = cuda_quantize::padded_keys(s.Sq), pk = cuda_quantize::padded_keys(s.Sk);
  WorkspaceRegions regions;
  SavedLayout l{};
  l.q = regions.take(bytes(s.q_elems()));
  l.k = regions.take(bytes(s.kv_elems()));
  l.qt = regions.take(bytes(s.B * s.Hq * s.D * pq));
  l.kt = regions.take(bytes(s.B * s.Hkv * s.D * pk));
  l.q_scale = regions.take(floats(s.B * s.Hq * (pq / cuda_quantize::kTokenBlock)));
  l.k_scale = regions.take(floats(s.B * s.Hkv * (pk / cuda_quantize::kTokenBlock)));
  l.k_mean = regions.take(floats(s.B * s.Hkv * s.D));
  l.lse_shift = regions.take(floats(s.lse_elems()));
  l.nonfinite = regions.take(kSavedFlags * sizeof(int));
  l.bytes = regions.bytes();
  return l;
}

// Throws fp4attn::Error("saved", ...) unless `saved` is an aligned block of
// at least saved_layout(shape).bytes for recipe fp8.
inline void check_saved(const void* saved, std::size_t given, const AttentionShape& s, Recipe recipe) {
  if (recipe != Recipe::fp8) throw Error("saved", "only recipe fp8 keeps the forward's operands for the backward");
  const std::size_t needed = saved_layout(s).bytes;
  if (given < needed)
    throw Error("saved", "needs " + std::to_string(needed) + " device bytes, got " + std::to_string(given));
  if (reinterpret_cast<std::uintptr_t>(saved) % kWorkspaceAlign != 0)
    throw Error("saved", "must be " + std::to_string(kWorkspaceAlign) + "-byte aligned");
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
