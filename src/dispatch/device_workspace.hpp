// What the zero-copy device entry points (sm90_device_cuda.cpp,
// sm90_backward_cuda.cpp) share: carving the caller's workspace into aligned
// regions, checking it, and turning device tensor views into quantizer inputs.
// Included by CUDA-build sources only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "cuda/common/packed_rows.hpp"
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

// The shape every per-token buffer (codes, transposed copies, block scales,
// row statistics) is laid out for: `s` itself, or for packed sequences one
// batch entry of the tile-aligned layout's rows (cuda/common/packed_rows.hpp).
// Per-sequence buffers (the smooth_k mean, V's channel scales) keep s.B.
inline AttentionShape layout_shape(const AttentionShape& s, PackedTokens packed) {
  if (!packed.packed()) return s;
  if (packed.q <= 0 || packed.k <= 0)
    throw Error("cu_seqlens", "packed sequences need the query and the key tokens in all (lse_pitch, k_tokens)");
  return {1, s.Hq, s.Hkv, cuda_common::packed_layout_rows(packed.q, s.B), cuda_common::packed_layout_rows(packed.k, s.B),
          s.D};
}

// Where a packed call keeps its checked cu_seqlens and its sequences' first
// rows (cuda_common::check_packed_sequences).
inline std::size_t packed_rows_bytes(const AttentionShape& s) {
  return static_cast<std::size_t>(cuda_common::packed_sequence_ints(s.B)) * sizeof(int);
}

// Where a training forward leaves Q's and K's quantized operands for the
// backward (DeviceForwardArgs::saved, DeviceBackwardArgs::saved): what the
// backward's first quantizer call would compute again, the transposed copies
// its gradient products read, the smooth_k mean and LSE shift, and the
// forward quantizer's non-finite flags (q, k, v). One layout for both sides.
//   fp8:         Q's and K's E4M3 codes, block scales and transposed copies.
//   mxfp4_train: K folded to E4M3 per 128-key tile (the same fold in both
//                directions), its factors and transposed copy; Q's MXFP4 codes
//                and E8M0 scales (mx_q_*), since the forward folds Q per row
//                and the backward per tile (q, qt and q_scale unused).
inline constexpr int kSavedFlags = 3;

struct SavedLayout {
  std::size_t q = 0, k = 0, qt = 0, kt = 0, q_scale = 0, k_scale = 0, mx_q_codes = 0, mx_q_scales = 0;
  std::size_t k_mean = 0, lse_shift = 0, nonfinite = 0, bytes = 0;
};

// Whether `recipe` keeps operands for its backward.
inline bool keeps_operands(Recipe recipe) { return recipe == Recipe::fp8 || recipe == Recipe::mxfp4_train; }

// Packed sequences: the tile-aligned layout of `packed` (layout_shape).
inline SavedLayout saved_layout(const AttentionShape& entries, Recipe recipe, PackedTokens packed = {}) {
  const auto floats = [](std::int64_t n) { return static_cast<std::size_t>(n) * sizeof(float); };
  const auto bytes = [](std::int64_t n) { return static_cast<std::size_t>(n); };
  const AttentionShape s = layout_shape(entries, packed);
  const std::int64_t pq = cuda_quantize::padded_keys(s.Sq), pk = cuda_quantize::padded_keys(s.Sk);
  WorkspaceRegions regions;
  SavedLayout l{};
  if (recipe == Recipe::mxfp4_train) {
    l.mx_q_codes = regions.take(bytes(s.q_elems() / 2));  // two E2M1 codes per byte
    l.mx_q_scales = regions.take(bytes(s.q_elems() / 32));  // one E8M0 per 32 along D
  } else {
    l.q = regions.take(bytes(s.q_elems()));
  }
  l.k = regions.take(bytes(s.kv_elems()));
  if (recipe != Recipe::mxfp4_train) l.qt = regions.take(bytes(s.B * s.Hq * s.D * pq));
  l.kt = regions.take(bytes(s.B * s.Hkv * s.D * pk));
  if (recipe != Recipe::mxfp4_train) l.q_scale = regions.take(floats(s.B * s.Hq * (pq / cuda_quantize::kTokenBlock)));
  l.k_scale = regions.take(floats(s.B * s.Hkv * (pk / cuda_quantize::kTokenBlock)));
  l.k_mean = regions.take(floats(entries.B * s.Hkv * s.D));
  l.lse_shift = regions.take(floats(s.lse_elems()));
  l.nonfinite = regions.take(kSavedFlags * sizeof(int));
  l.bytes = regions.bytes();
  return l;
}

// Throws fp4attn::Error("saved", ...) unless `saved` is an aligned block of
// at least saved_layout(shape, recipe).bytes for a recipe that keeps operands.
inline void check_saved(const void* saved, std::size_t given, const AttentionShape& s, Recipe recipe,
                        PackedTokens packed = {}) {
  if (!keeps_operands(recipe))
    throw Error("saved", "only recipes fp8 and mxfp4_train keep the forward's operands for the backward");
  const std::size_t needed = saved_layout(s, recipe, packed).bytes;
  if (given < needed)
    throw Error("saved", "needs " + std::to_string(needed) + " device bytes, got " + std::to_string(given));
  if (reinterpret_cast<std::uintptr_t>(saved) % kWorkspaceAlign != 0)
    throw Error("saved", "must be " + std::to_string(kWorkspaceAlign) + "-byte aligned");
}

// A packed call's cu_seqlens checked on the device (cuda_common::check_packed_sequences)
// into `ints` (packed_rows_bytes of them): where they do not fit the call's sizes every
// sequence is empty there and O, bf16 (lse_pitch, Hq, D) at the given element strides,
// and the LSE, (Hq, lse_pitch), are NaN. Returns the checked copies and the sequences'
// first rows in the tile-aligned layout, which everything after reads.
inline cuda_common::PackedSequences check_packed_call(const int* cu_seqlens_q, const int* cu_seqlens_k,
                                                      const AttentionShape& s, std::int64_t lse_pitch,
                                                      std::int64_t k_tokens, void* o, std::int64_t o_stride_s,
                                                      std::int64_t o_stride_h, float* lse, int* ints,
                                                      cudaStream_t stream) {
  using Fill = cuda_common::NanFill;
  const Fill o_fill{o, Fill::Type::bf16, lse_pitch, s.Hq, s.D, o_stride_s, o_stride_h};
  const Fill lse_fill{lse, Fill::Type::f32, s.Hq, 1, lse_pitch, lse_pitch, 0};
  cuda_common::check_packed_sequences(cu_seqlens_q, cu_seqlens_k,
                                      {static_cast<int>(s.B), lse_pitch, k_tokens, s.Sq, s.Sk}, ints,
                                      {o_fill, lse_fill, Fill{}}, stream);
  return cuda_common::packed_sequences(ints, static_cast<int>(s.B));
}

inline cuda_quantize::ElementType element_type(DeviceElement e) {
  switch (e) {
    case DeviceElement::f32: return cuda_quantize::ElementType::f32;
    case DeviceElement::f16: return cuda_quantize::ElementType::f16;
    case DeviceElement::bf16: return cuda_quantize::ElementType::bf16;
  }
  throw Error("dtype", "unknown device element type");
}

// The quantizer's view of a (B, S, H, D) device tensor; `name` names a null
// pointer. cu_seqlens: packed sequences (StridedInput::cu_seqlens), or null.
inline cuda_quantize::StridedInput strided(const DeviceTensorView& x, DeviceElement e, std::int64_t B, std::int64_t S,
                                           std::int64_t H, std::int64_t D, const char* name,
                                           const int* cu_seqlens = nullptr) {
  if (x.data == nullptr) throw Error(name, "is a null device pointer");
  return {x.data, element_type(e), B, S, H, D, x.stride_b, x.stride_s, x.stride_h, cu_seqlens};
}

}  // namespace fp4attn::dispatch
