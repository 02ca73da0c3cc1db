// Owning device allocations for host code: freed on scope exit, failures
// thrown as fp4attn::Error naming "cuda" so that callers report one line.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <memory>
#include <string>

#include "fp4attn/error.hpp"

namespace fp4attn::cuda_common {

inline void check_cuda(cudaError_t err, const std::string& what) {
  if (err != cudaSuccess) throw Error("cuda", what + ": " + cudaGetErrorString(err));
}
// The same for a fixed name, with no string built on success (launch paths).
inline void check_cuda(cudaError_t err, const char* what) {
  if (err != cudaSuccess) throw Error("cuda", std::string(what) + ": " + cudaGetErrorString(err));
}

struct CudaFree {
  void operator()(void* p) const noexcept { cudaFree(p); }
};
using DeviceMemory = std::unique_ptr<void, CudaFree>;

inline DeviceMemory device_alloc(std::size_t bytes) {
  void* p = nullptr;
  check_cuda(cudaMalloc(&p, bytes), "cudaMalloc of " + std::to_string(bytes) + " bytes");
  return DeviceMemory(p);
}

template <class T>
T* as(const DeviceMemory& m) {
  return static_cast<T*>(m.get());
}

}  // namespace fp4attn::cuda_common
