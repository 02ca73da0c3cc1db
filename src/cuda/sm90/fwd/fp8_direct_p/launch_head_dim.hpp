// The FP8 forward's launcher for one head dimension, called by forward_fp8
// (launch.cu) once it has checked the arguments. Defined in
// launch_head_dim.cuh and instantiated once per head dimension in its own
// translation unit (launch_d64.cu, launch_d128.cu; the three-consumer D = 64
// kernels in launch_d64_three.cu), so that each is compiled with the ptxas
// options measured best for it (CMakeLists.txt).
#pragma once

#include <cuda_runtime.h>

#include "cuda/sm90/fwd/fwd.hpp"

namespace fp4attn::sm90::fwd {

template <int HeadDim>
void forward_fp8_head_dim(const Fp8ForwardArgs& args, cudaStream_t stream);

#ifdef FP4ATTN_FWD_TIMELINE
// Each of those translation units records into its own marks (timeline.cuh):
// the one of the kernels with HeadDim and Consumers.
template <int HeadDim, int Consumers>
cudaError_t timeline_read(void* dst, unsigned long long bytes);
template <int HeadDim, int Consumers>
cudaError_t timeline_clear();
#endif

}  // namespace fp4attn::sm90::fwd
