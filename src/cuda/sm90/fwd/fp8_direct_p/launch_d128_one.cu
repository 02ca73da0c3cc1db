// The FP8 forward's one-consumer kernels at D = 128 (64-row CTAs, two an SM)
// with P by exp2 (recipe fp8's E4M3 P and recipe mxfp4's FP4 P), in a
// translation unit of their own so that they compile beside the other
// kernels. Direct-P keeps two consumers at D = 128 (perf log sc2).
#include "cuda/sm90/fwd/fp8_direct_p/launch_head_dim.cuh"

namespace fp4attn::sm90::fwd::fp8_launch {

template void launch<128, 1, PCode::exp2_cvt>(const Fp8ForwardArgs&, cudaStream_t);
template void launch<128, 1, PCode::mxfp4_exp2>(const Fp8ForwardArgs&, cudaStream_t);

}  // namespace fp4attn::sm90::fwd::fp8_launch
