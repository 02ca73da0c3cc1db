// The FP8 forward's kernels and launcher at D = 128 (launch_head_dim.hpp).
#include "cuda/sm90/fwd/fp8_direct_p/launch_head_dim.cuh"

namespace fp4attn::sm90::fwd {

template void forward_fp8_head_dim<128>(const Fp8ForwardArgs&, cudaStream_t);
#ifdef FP4ATTN_FWD_TIMELINE
template cudaError_t timeline_read<128, 2>(void*, unsigned long long);
template cudaError_t timeline_clear<128, 2>();
#endif

}  // namespace fp4attn::sm90::fwd
