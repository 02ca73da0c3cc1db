// MXFP4 operands folded into E4M3 for the sm90 FP8 forward kernel (DESIGN
// §3.4): Hopper has no FP4 tensor cores, so each E2M1 element q of a block with
// exponent E becomes the E4M3 byte of q·2^(E − R + 6), R the largest block
// exponent of its fold group, and the group keeps the factor 2^(R − 6) outside
// the product. Blocks more than 14 binades below R round to E4M3 subnormals or
// zero: emulator::fold_mx_to_e4m3 (src/emulator/operands.hpp) built from the
// same host-device decode / encode_rne_sat of formats.hpp, so the bytes match
// the CPU model bit for bit.
//
// Inputs are the layouts cuda/quantize/quantize_fp4.hpp writes; outputs the
// layouts the FP8 kernel reads (cuda/sm90/fwd/fwd.hpp):
//   fold_mx_qk: codes (B, H, S, D/2) + E8M0 scales (B, H, S, D/32)
//               → E4M3 (B, S, H, D) contiguous, factor per fold group of
//               `fold_rows` consecutive tokens of one (b, h): 1 for Q (one
//               factor per query row), 128 for K (one per key tile, where the
//               FP8 recipe's k_scale goes). factor: (B, H, ceil(S / fold_rows)).
//   fold_mx_v : transposed codes (B, H, D, S_pad/2) + scales (B, H, S_pad/32, D)
//               → Vᵀ (B, H, D, vt_keys), keys permuted inside each group of 32
//               by vt_key_of_slot and zero past S; one factor per channel over
//               the whole sequence (where the FP8 recipe's v_scale goes).
//   With a null e4m3 / vt only the factors are written: the forward kernel
//   that expands MXFP4 itself (fp8_direct_p/fp4_expand.cuh) reads each
//   group's R back from them.
//   mx_lse_shift: smooth_k's LSE correction softmax_scale · Σ_d q[d]·k_mean[d]
//               over Q's dequantized MXFP4 values, summed in d order with
//               separate multiply and add (emulator::smooth_k_shift).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "cuda/quantize/quantize_fp4.hpp"

namespace fp4attn::cuda_quantize {

inline constexpr int kMxFoldKeyTile = 128;  // K's fold group: the forward kernel's key tile

// e4m3_t (optional, 16-byte aligned, needs e4m3): the folded codes also
// transposed, (B, H, D, S rounded up to 128), each 32-token group in Vᵀ's
// slot order (vt_key_of_slot), zero codes past S: the FP8 backward's
// token-major operands (recipe mxfp4_train).
void fold_mx_qk(const Fp4Output& in, std::int64_t B, std::int64_t S, std::int64_t H, std::int64_t D, int fold_rows,
                std::uint8_t* e4m3, float* factor, cudaStream_t stream, std::uint8_t* e4m3_t = nullptr);

void fold_mx_v(const Fp4Output& in, std::int64_t B, std::int64_t S, std::int64_t H, std::int64_t D,
               std::int64_t vt_keys, std::uint8_t* vt, float* factor, cudaStream_t stream);

// q: MXFP4 codes (16-byte aligned) and scales of Q (B, Hq, Sq, ·); k_mean (B, Hkv, D),
// 16-byte aligned; out (B, Hq, Sq).
void mx_lse_shift(const Fp4Output& q, std::int64_t B, std::int64_t Sq, std::int64_t Hq, std::int64_t Hkv,
                  std::int64_t D, const float* k_mean, float softmax_scale, float* lse_shift, cudaStream_t stream);

}  // namespace fp4attn::cuda_quantize
