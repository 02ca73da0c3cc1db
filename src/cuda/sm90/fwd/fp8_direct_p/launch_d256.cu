// The FP8 forward's kernels and launcher at D = 256 and the head dims above
// 128 read with zero channels (launch_head_dim.hpp): recipe fp8 only.
#include "cuda/sm90/fwd/fp8_direct_p/launch_head_dim.cuh"

namespace fp4attn::sm90::fwd {

template void forward_fp8_head_dim<256>(const Fp8ForwardArgs&, cudaStream_t);

}  // namespace fp4attn::sm90::fwd
