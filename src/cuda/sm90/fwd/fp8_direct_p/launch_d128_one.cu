// The FP8 forward's one-consumer kernel at D = 128 (64-row CTAs, two an SM)
// with exp2 P, in a translation unit of its own so that it compiles beside
// the other kernels. Direct-P keeps two consumers at D = 128 (perf log sc2).
#include "cuda/sm90/fwd/fp8_direct_p/launch_head_dim.cuh"

namespace fp4attn::sm90::fwd::fp8_launch {

template void launch<128, 1, PCode::exp2_cvt>(const Fp8ForwardArgs&, cudaStream_t);

}  // namespace fp4attn::sm90::fwd::fp8_launch
