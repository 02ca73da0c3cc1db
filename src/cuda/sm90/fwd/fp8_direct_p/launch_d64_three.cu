// The FP8 forward's three-consumer kernels at D = 64 (192-row CTAs), in a
// translation unit of their own: CMakeLists.txt compiles it with ptxas's
// --register-usage-level=7, which measured +0 to +1.8 % for these kernels in
// bursts (+0.5 to +0.9 % sustained) and −2.4 % for the two-consumer ones of
// launch_d64.cu (docs/perf-log.md, v24).
#include "cuda/sm90/fwd/fp8_direct_p/launch_head_dim.cuh"

namespace fp4attn::sm90::fwd::fp8_launch {

template void launch<64, 3, PCode::direct_p>(const Fp8ForwardArgs&, cudaStream_t);
template void launch<64, 3, PCode::exp2_cvt>(const Fp8ForwardArgs&, cudaStream_t);
template void launch<64, 3, PCode::mxfp4_direct_p>(const Fp8ForwardArgs&, cudaStream_t);
template void launch<64, 3, PCode::mxfp4_exp2>(const Fp8ForwardArgs&, cudaStream_t);
template void launch<64, 3, PCode::direct_p, true>(const Fp8ForwardArgs&, cudaStream_t);  // D = 16, 32, 48
template void launch<64, 3, PCode::exp2_cvt, true>(const Fp8ForwardArgs&, cudaStream_t);

}  // namespace fp4attn::sm90::fwd::fp8_launch

#ifdef FP4ATTN_FWD_TIMELINE
namespace fp4attn::sm90::fwd {
template cudaError_t timeline_read<64, 3>(void*, unsigned long long);
template cudaError_t timeline_clear<64, 3>();
}  // namespace fp4attn::sm90::fwd
#endif
