// The FP8 forward's kernels and launcher at D = 64 (launch_head_dim.hpp). The
// three-consumer kernels are instantiated in launch_d64_three.cu, which is
// compiled with other ptxas options.
#include "cuda/sm90/fwd/fp8_direct_p/launch_head_dim.cuh"

namespace fp4attn::sm90::fwd {

namespace fp8_launch {
extern template void launch<64, 3, PCode::direct_p>(const Fp8ForwardArgs&, cudaStream_t);
extern template void launch<64, 3, PCode::exp2_cvt>(const Fp8ForwardArgs&, cudaStream_t);
extern template void launch<64, 3, PCode::mxfp4_direct_p>(const Fp8ForwardArgs&, cudaStream_t);
extern template void launch<64, 3, PCode::mxfp4_exp2>(const Fp8ForwardArgs&, cudaStream_t);
extern template void launch<64, 3, PCode::direct_p, true>(const Fp8ForwardArgs&, cudaStream_t);
extern template void launch<64, 3, PCode::exp2_cvt, true>(const Fp8ForwardArgs&, cudaStream_t);
}  // namespace fp8_launch

template void forward_fp8_head_dim<64>(const Fp8ForwardArgs&, cudaStream_t);
#ifdef FP4ATTN_FWD_TIMELINE
template cudaError_t timeline_read<64, 2>(void*, unsigned long long);
template cudaError_t timeline_clear<64, 2>();
#endif

}  // namespace fp4attn::sm90::fwd
