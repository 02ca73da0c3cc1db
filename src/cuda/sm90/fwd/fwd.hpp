// Host-side entry of the sm90 forward kernels: argument block and launcher.
// No device code here, so dispatch and the C ABI can include it from .cpp files.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "fp4attn/recipe.hpp"

namespace fp4attn::sm90::fwd {

// How a score becomes its E4M3 P code (DESIGN §3.3).
enum class PCode : std::uint8_t {
  direct_p,  // bits built from a polynomial of the score: no MUFU, no F2FP (the method)
  exp2_cvt,  // ex2.approx then cvt.rn.satfinite.e4m3x2 (the comparison baseline)
  // Recipe mxfp4's FP4 P on sm90 (DESIGN §3.4): per row and 32-key block the
  // Direct-P block exponent E and E2M1 codes, folded into E4M3 against
  // R = −2, the ceiling of every E: values q·2^(E + 8), P's offset 2^8 as
  // for FP8 P.
  mxfp4_direct_p,
  // The same FP4 P by the baseline rule: ex2.approx, then the MX quantizer's
  // block scale (Fp8ForwardArgs::mx_scale_rule) and E2M1 rounding.
  mxfp4_exp2,
};

// P by ex2.approx (the comparison baselines, FP8 or FP4 P) rather than by Direct-P.
constexpr bool p_by_exp2(PCode c) { return c == PCode::exp2_cvt || c == PCode::mxfp4_exp2; }

// Keys of one Vᵀ row are padded to this multiple (the kernel's key tile), so
// Vᵀ tiles never run past the end of a row.
inline constexpr std::int64_t kVtKeyAlign = 128;

// Device pointers and sizes of one recipe-fp8 forward call. Q and K are
// (B, S, H, D) E4M3 codes with byte strides on B, S, H (D contiguous; strides
// multiples of 16, as TMA requires: rows of an odd multiple of 8 channels sit
// at a wider pitch, Fp8Buffers::code_pitch). Vᵀ is the layout the GPU quantizer
// writes: (B, Hkv, D, vt_keys) with keys permuted inside each group of 32
// (see cuda/quantize/quantize_fp8.hpp). Scales are those of the fp8 recipe.
struct Fp8ForwardArgs {
  const std::uint8_t* q = nullptr;
  std::int64_t q_stride_b = 0, q_stride_s = 0, q_stride_h = 0;
  const std::uint8_t* k = nullptr;
  std::int64_t k_stride_b = 0, k_stride_s = 0, k_stride_h = 0;
  const std::uint8_t* vt = nullptr;
  std::int64_t vt_keys = 0;
  const float* q_scale = nullptr;    // (B, Hq, ceil(Sq / q_scale_rows))
  const float* k_scale = nullptr;    // (B, Hkv, ceil(Sk / 128))
  const float* v_scale = nullptr;    // (B, Hkv, D)
  const float* lse_shift = nullptr;  // (B, Hq, Sq) added to finite LSE (smooth_k), or null
  void* o = nullptr;                 // bf16 (B, Sq, Hq, D), element strides on B, S, H
  std::int64_t o_stride_b = 0, o_stride_s = 0, o_stride_h = 0;
  float* lse = nullptr;  // (B, Hq, Sq), natural log
  // The quantizer's three non-finite flags (q, k, v), or null. When any is
  // set, every O and LSE element this call writes is NaN: callers that cannot
  // synchronise to raise an error (the zero-copy device path) still never
  // return finite numbers computed from non-finite input.
  const int* nonfinite = nullptr;
  // Recipe mxfp4 with MXFP4 in memory (cuda/quantize/quantize_fp4.hpp's
  // layouts): when q_fp4 is set the kernel reads these codes and E8M0 scales
  // instead of q, k and vt, and expands them into its E4M3 tiles itself
  // (fp8_direct_p/fp4_expand.cuh). q_scale, k_scale and v_scale are then the
  // fold factors 2^(R − 6) of fold_mx.hpp, from which it takes each group's R.
  const std::uint8_t* q_fp4 = nullptr;  // (B, Hq, Sq, D/2) codes, then (B, Hq, Sq, D/32) scales
  const std::uint8_t* q_fp4_scales = nullptr;
  const std::uint8_t* k_fp4 = nullptr;  // (B, Hkv, Sk, D/2), (B, Hkv, Sk, D/32)
  const std::uint8_t* k_fp4_scales = nullptr;
  const std::uint8_t* vt_fp4 = nullptr;  // (B, Hkv, D, S_pad/2), (B, Hkv, S_pad/32, D)
  const std::uint8_t* v_fp4_scales = nullptr;
  std::int64_t v_fp4_tokens = 0;  // S_pad: Sk rounded up to a multiple of 32
  // Query rows that share one q_scale: 128 (the fp8 recipe's token block) or
  // 1 (MXFP4 Q folded into E4M3 per row, cuda/quantize/fold_mx.hpp).
  int q_scale_rows = 128;
  int B = 0, Hq = 0, Hkv = 0, Sq = 0, Sk = 0, D = 0;
  float softmax_scale = 0.0f;  // already resolved (> 0)
  MaskKind mask = MaskKind::none;
  // A sliding window (recipe.hpp's Window), -1 for no bound; with the mask's
  // diagonal it bounds each row's keys on either side.
  int window_left = -1, window_right = -1;
  PCode p_code = PCode::direct_p;
  MxScaleRule mx_scale_rule = MxScaleRule::round_up;  // PCode::mxfp4_exp2's block scale
  // Packed sequences of different lengths (FlashAttention's varlen batches),
  // or null: B + 1 device ints each; entry b has query rows cu_seqlens_q[b] ..
  // cu_seqlens_q[b + 1] − 1 and as many keys as cu_seqlens_k gives it (Sq
  // and Sk are the longest: the grid). The quantized operands take the
  // tile-aligned layout (cuda/common/packed_rows.hpp): Q one batch entry of
  // q_rows tokens, K and Vᵀ of k_rows (vt_keys = k_rows), the scales and
  // lse_shift as for that one entry, and entry b's tokens from row rows_q[b]
  // (rows_k[b]) on; v_scale stays (B, Hkv, D). O is packed (total_q, Hq, D)
  // with o_stride_b unused, and the LSE packed (Hq, lse_pitch = total_q).
  // Recipe fp8's E4M3 operands only.
  const int* cu_seqlens_q = nullptr;
  const int* cu_seqlens_k = nullptr;
  std::int64_t lse_pitch = 0;
  const int* rows_q = nullptr;
  const int* rows_k = nullptr;
  std::int64_t q_rows = 0, k_rows = 0;
  // Packed sequences whose Q and K codes the kernel reads where the caller's
  // packed tensors hold them (E4M3 inputs): q of total_q token rows and k of
  // total_k at their strides (stride_b unused), entry b's from row
  // cu_seqlens_q[b] (cu_seqlens_k[b]). A tile that runs past its sequence
  // reads the next one's rows, whose keys the mask drops and whose query rows
  // are never stored. The scales, Vᵀ and lse_shift keep the tile-aligned
  // layout. False: Q and K are in the layout too.
  bool qk_in_place = false;
  std::int64_t total_q = 0, total_k = 0;
  // Consumer warpgroups per CTA: 0 lets the launcher choose (at D = 64 three
  // where whole waves of 192-row CTAs come out faster, else one, two CTAs an
  // SM, where a CTA's keys are few; at D = 128 one with exp2 P;
  // fp8_direct_p/consumer_count.hpp); 2 (any D), 3 (D = 64 without q_fp4) or
  // 1 (from E4M3: D = 64 with FP8 P, D = 128 with exp2 P) force that count
  // (tests, A/B runs).
  int consumers = 0;
};

// Launches the kernel for args.D (64 or 128) on `stream`. Throws fp4attn::Error
// for arguments the kernel cannot take (alignment, head dim) and on CUDA errors.
void forward_fp8(const Fp8ForwardArgs& args, cudaStream_t stream);

}  // namespace fp4attn::sm90::fwd
