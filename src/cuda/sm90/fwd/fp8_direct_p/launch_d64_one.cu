// The FP8 forward's one-consumer kernels at D = 64 (64-row CTAs, two an SM)
// with recipe fp8's P codes, in a translation unit of their own so that they
// compile beside the other kernels.
#include "cuda/sm90/fwd/fp8_direct_p/launch_head_dim.cuh"

namespace fp4attn::sm90::fwd::fp8_launch {

template void launch<64, 1, PCode::direct_p>(const Fp8ForwardArgs&, cudaStream_t);
template void launch<64, 1, PCode::exp2_cvt>(const Fp8ForwardArgs&, cudaStream_t);

}  // namespace fp4attn::sm90::fwd::fp8_launch
