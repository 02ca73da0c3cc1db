// Host-side pieces both GPU quantizers (quantize_fp8.cu, quantize_fp4.cu) use
// to launch: the device view of a strided input, the call's workspace and the
// SM count that sizes persistent grids.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <utility>

#include "cuda/common/device_info.hpp"
#include "cuda/common/device_memory.hpp"
#include "cuda/quantize/quantize_fp8.hpp"
#include "cuda/quantize/segment.cuh"

namespace fp4attn::cuda_quantize {

inline bool aligned(const void* p, std::size_t bytes) { return reinterpret_cast<std::uintptr_t>(p) % bytes == 0; }

// The kernel's view of `x`; 16-byte loads when the base and every stride allow them.
template <class T>
InputView<T> view_of(const StridedInput& x) {
  constexpr std::int64_t per_vector = kVectorBytes / sizeof(T);
  const bool vector = aligned(x.data, kVectorBytes) && x.stride_b % per_vector == 0 &&
                      x.stride_s % per_vector == 0 && x.stride_h % per_vector == 0;
  return {static_cast<const T*>(x.data), x.stride_b, x.stride_s, x.stride_h, vector, x.cu_seqlens};
}

// Workspace for one call: the caller's, or a stream-ordered allocation freed
// after the launches on the same stream.
class CallWorkspace {
 public:
  CallWorkspace(void* given, std::size_t bytes, cudaStream_t stream) : ptr_(given), stream_(stream) {
    if (ptr_ == nullptr) {
      cuda_common::check_cuda(cudaMallocAsync(&ptr_, bytes, stream), "cudaMallocAsync (quantizer workspace)");
      owned_ = true;
    }
  }
  CallWorkspace(const CallWorkspace&) = delete;
  CallWorkspace& operator=(const CallWorkspace&) = delete;
  ~CallWorkspace() {
    if (owned_) cudaFreeAsync(ptr_, stream_);
  }
  unsigned char* bytes() const { return static_cast<unsigned char*>(ptr_); }

 private:
  void* ptr_;
  cudaStream_t stream_;
  bool owned_ = false;
};

using cuda_common::sm_count;

// Launches `kernel`; with `after_own_kernel` as a programmatic dependent of
// the previous kernel on `stream`, which must be one of the quantizer's own
// (its statistics pass: never the caller's work, which may still be writing
// the input). The kernel may then start while that one finishes, and calls
// cudaGridDependencySynchronize before it reads what it wrote or writes
// anything itself; it may read its input before.
template <class... Params, class... Args>
void launch_kernel(void (*kernel)(Params...), dim3 grid, unsigned threads, std::size_t smem, cudaStream_t stream,
                   bool after_own_kernel, const char* what, Args&&... args) {
  cudaLaunchAttribute dependent{};
  dependent.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  dependent.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = dim3(threads);
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  config.attrs = after_own_kernel ? &dependent : nullptr;
  config.numAttrs = after_own_kernel ? 1 : 0;
  cuda_common::check_cuda(cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...), what);
}

}  // namespace fp4attn::cuda_quantize
