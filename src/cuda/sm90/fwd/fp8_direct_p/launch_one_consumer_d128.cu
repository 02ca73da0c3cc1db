// The FP8 forward's one-consumer kernels (64-row CTAs, two an SM) at D = 128
// with recipe fp8's P codes. CMakeLists.txt compiles this translation unit
// with ptxas's --register-usage-level=10, as launch_d128.cu: at the default
// level the consumer's 232 registers spilled.
#include "cuda/sm90/fwd/fp8_direct_p/launch_head_dim.cuh"

namespace fp4attn::sm90::fwd::fp8_launch {

template void launch<128, 1, PCode::direct_p>(const Fp8ForwardArgs&, cudaStream_t);
template void launch<128, 1, PCode::exp2_cvt>(const Fp8ForwardArgs&, cudaStream_t);

}  // namespace fp4attn::sm90::fwd::fp8_launch
