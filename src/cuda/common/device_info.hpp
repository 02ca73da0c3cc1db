// Properties of the current CUDA device that launch decisions depend on.
#pragma once

#include <cuda_runtime_api.h>

#include "cuda/common/device_memory.hpp"

namespace fp4attn::cuda_common {

// Streaming multiprocessors of the current device.
inline int sm_count() {
  int device = 0, sms = 0;
  check_cuda(cudaGetDevice(&device), "cudaGetDevice");
  check_cuda(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), "cudaDeviceGetAttribute");
  return sms;
}

}  // namespace fp4attn::cuda_common
