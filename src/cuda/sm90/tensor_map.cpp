#include "cuda/sm90/tensor_map.hpp"

#include <cuda_runtime_api.h>
#include <cudaTypedefs.h>

#include "fp4attn/error.hpp"

namespace fp4attn::sm90 {
namespace {

// cuTensorMapEncodeTiled has kept its 12.0 signature; ask for that version.
constexpr unsigned kEncodeTiledVersion = 12000;
constexpr std::uint64_t kTmaStrideAlign = 16;

PFN_cuTensorMapEncodeTiled_v12000 encode_tiled() {
  static const PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* ptr = nullptr;
    cudaDriverEntryPointQueryResult status{};
    const cudaError_t err =
        cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &ptr, kEncodeTiledVersion, cudaEnableDefault, &status);
    if (err != cudaSuccess || status != cudaDriverEntryPointSuccess || ptr == nullptr)
      throw Error("cuda", "the driver does not provide cuTensorMapEncodeTiled");
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(ptr);
  }();
  return fn;
}

}  // namespace

CUtensorMap make_byte_tensor_map(const void* base, const std::array<std::uint64_t, 4>& dims,
                                 const std::array<std::uint64_t, 3>& byte_strides,
                                 const std::array<std::uint32_t, 4>& box, TmaSwizzle swizzle, const std::string& name) {
  for (std::uint64_t s : byte_strides)
    if (s % kTmaStrideAlign != 0)
      throw Error(name, "strides must be multiples of 16 bytes for TMA, got " + std::to_string(s));
  if (reinterpret_cast<std::uintptr_t>(base) % kTmaStrideAlign != 0)
    throw Error(name, "base address must be 16-byte aligned for TMA");
  CUtensorMap map{};
  const std::array<cuuint32_t, 4> element_strides = {1, 1, 1, 1};
  const CUresult res = encode_tiled()(
      &map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 4, const_cast<void*>(base), dims.data(), byte_strides.data(), box.data(),
      element_strides.data(), CU_TENSOR_MAP_INTERLEAVE_NONE,
      swizzle == TmaSwizzle::b128  ? CU_TENSOR_MAP_SWIZZLE_128B
      : swizzle == TmaSwizzle::b64 ? CU_TENSOR_MAP_SWIZZLE_64B
                                   : CU_TENSOR_MAP_SWIZZLE_NONE,
      CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (res != CUDA_SUCCESS) throw Error(name, "cuTensorMapEncodeTiled failed with CUresult " + std::to_string(res));
  return map;
}

}  // namespace fp4attn::sm90
