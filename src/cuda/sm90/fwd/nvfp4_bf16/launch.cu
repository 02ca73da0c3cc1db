// Host launcher of the NVFP4 forward on BF16 wgmma: tensor maps, grid, shared memory.
#include <string>

#include "cuda/common/device_memory.hpp"
#include "cuda/sm90/fwd/nvfp4_bf16/kernel.cuh"
#include "cuda/sm90/tensor_map.hpp"
#include "fp4attn/error.hpp"

namespace fp4attn::sm90::fwd {
namespace {

using cuda_common::check_cuda;

std::uint64_t u64(std::int64_t v) { return static_cast<std::uint64_t>(v); }

constexpr std::int64_t kVtKeyMultiple = 32;  // the NVFP4 quantizer's padded sequence

template <int HeadDim, bool kDirectP>
void launch(const Nvfp4ForwardArgs& a, cudaStream_t stream) {
  using Cfg = nvfp4::Config<HeadDim>;
  // bf16 tensors seen as bytes: a box is one 128-byte atom of 64 elements.
  const std::int64_t row = HeadDim * nvfp4::kBf16Bytes;
  const CUtensorMap tm_q = make_byte_tensor_map(a.q, {u64(row), u64(a.Sq), u64(a.Hq), u64(a.B)},
                                                {u64(row), u64(row * a.Sq), u64(row * a.Sq * a.Hq)},
                                                {Cfg::kAtomBytes, Cfg::kBlockQ, 1, 1}, TmaSwizzle::b128, "q");
  const CUtensorMap tm_k = make_byte_tensor_map(a.k, {u64(row), u64(a.Sk), u64(a.Hkv), u64(a.B)},
                                                {u64(row), u64(row * a.Sk), u64(row * a.Sk * a.Hkv)},
                                                {Cfg::kAtomBytes, Cfg::kBlockK, 1, 1}, TmaSwizzle::b128, "k");
  const std::int64_t vt_row = a.vt_keys * nvfp4::kBf16Bytes;
  const CUtensorMap tm_vt = make_byte_tensor_map(a.vt, {u64(vt_row), u64(HeadDim), u64(a.Hkv), u64(a.B)},
                                                 {u64(vt_row), u64(vt_row * HeadDim), u64(vt_row * HeadDim * a.Hkv)},
                                                 {Cfg::kAtomBytes, HeadDim, 1, 1}, TmaSwizzle::b128, "vt");

  // A window's left edge runs the instance that masks both bounds (kernel.cuh).
  auto* kernel = a.window_left >= 0 ? &nvfp4::nvfp4_forward_kernel<HeadDim, kDirectP, true>
                                    : &nvfp4::nvfp4_forward_kernel<HeadDim, kDirectP, false>;
  constexpr int kSmem = nvfp4::smem_bytes<Cfg>();
  check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem), "cudaFuncSetAttribute");
  const dim3 grid((a.Sq + Cfg::kBlockQ - 1) / Cfg::kBlockQ, a.Hq, a.B);
  kernel<<<grid, Cfg::kThreads, kSmem, stream>>>(a, tm_q, tm_k, tm_vt);
  check_cuda(cudaGetLastError(), "nvfp4_forward_kernel launch");
}

}  // namespace

void forward_nvfp4(const Nvfp4ForwardArgs& a, cudaStream_t stream) {
  if (a.D != 64 && a.D != 128)
    throw Error("D", "the sm90 nvfp4 kernel supports D = 64 and 128, got " + std::to_string(a.D));
  if (a.B <= 0 || a.Hq <= 0 || a.Sq <= 0 || a.Sk <= 0)
    throw Error("shape", "B, Hq, Sq and Sk must be positive");
  if (a.Hkv <= 0 || a.Hq % a.Hkv != 0) throw Error("Hkv", "Hq must be a multiple of Hkv");
  if (a.vt_keys % kVtKeyMultiple != 0 || a.vt_keys < a.Sk)
    throw Error("vt", "Vᵀ rows must hold Sk keys padded to a multiple of " + std::to_string(kVtKeyMultiple));
  if (a.o_stride_s % 2 != 0 || a.o_stride_h % 2 != 0 || a.o_stride_b % 2 != 0)
    throw Error("o", "element strides must be even (the kernel stores bf16 pairs)");
  if (!(a.softmax_scale > 0.0f)) throw Error("softmax_scale", "must be positive");
  if (a.window_left < -1) throw Error("window_left", "must be -1 (none) or a key count >= 0");
  if (a.window_right < -1) throw Error("window_right", "must be -1 (none) or a key count >= 0");
  if (a.q == nullptr) throw Error("q", "is a null device pointer");
  if (a.k == nullptr) throw Error("k", "is a null device pointer");
  if (a.vt == nullptr) throw Error("vt", "is a null device pointer");
  if (a.q_tensor_scale == nullptr || a.k_tensor_scale == nullptr || a.v_tensor_scale == nullptr)
    throw Error("tensor_scale", "the three NVFP4 tensor scales must be device pointers");
  if (a.o == nullptr) throw Error("o", "is a null device pointer");
  if (a.lse == nullptr) throw Error("lse", "is a null device pointer");
  if (a.D == 128) return a.direct_p ? launch<128, true>(a, stream) : launch<128, false>(a, stream);
  return a.direct_p ? launch<64, true>(a, stream) : launch<64, false>(a, stream);
}

}  // namespace fp4attn::sm90::fwd
