// Pre-pass of the sm90 NVFP4 forward: the NVFP4 quantizer's codes and UE4M3
// block scales (cuda/quantize/quantize_fp4.hpp layouts) expanded to BF16
// values E2M1 · s_b, exactly (at most 2 × 4 significant bits, DESIGN §3.4);
// the fp32 tensor scale is not applied (the kernel keeps it outside the
// products). The outputs are the layouts the forward kernel loads with TMA
// (cuda/sm90/fwd/nvfp4_fwd.hpp):
//   expand_nvfp4_qk: codes (B, H, S, D/2) + scales (B, H, S, D/16)
//                    → bf16 (B, H, S, D)
//   expand_nvfp4_vt: transposed codes (B, H, D, S_pad/2) + scales
//                    (B, H, S_pad/16, D) → bf16 Vᵀ (B, H, D, S_pad): the
//                    K-major B operand of P·V, keys in order
//   nvfp4_lse_shift: smooth_k's LSE correction softmax_scale · Σ_d q[d]·k_mean[d]
//                    over Q's dequantized values (element · s_b / S_enc), in
//                    d order with separate multiply and add (emulator::smooth_k_shift)
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "cuda/quantize/quantize_fp4.hpp"

namespace fp4attn::sm90::fwd {

void expand_nvfp4_qk(const cuda_quantize::Fp4Output& in, std::int64_t B, std::int64_t S, std::int64_t H,
                     std::int64_t D, void* bf16_out, cudaStream_t stream);

// S_pad = cuda_quantize::fp4_padded_tokens(S).
void expand_nvfp4_vt(const cuda_quantize::Fp4Output& in, std::int64_t B, std::int64_t S, std::int64_t H,
                     std::int64_t D, void* bf16_out, cudaStream_t stream);

// q: NVFP4 codes, scales and tensor scale of Q (B, Hq, Sq, ·); k_mean (B, Hkv, D); out (B, Hq, Sq).
void nvfp4_lse_shift(const cuda_quantize::Fp4Output& q, std::int64_t B, std::int64_t Sq, std::int64_t Hq,
                     std::int64_t Hkv, std::int64_t D, const float* k_mean, float softmax_scale, float* lse_shift,
                     cudaStream_t stream);

}  // namespace fp4attn::sm90::fwd
