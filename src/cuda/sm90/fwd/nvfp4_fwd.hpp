// Host-side entry of the sm90 NVFP4 forward (recipe nvfp4 on BF16 wgmma,
// DESIGN §3.4): argument block and launcher. No device code here, so dispatch
// can include it from .cpp files.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "fp4attn/recipe.hpp"

namespace fp4attn::sm90::fwd {

// Device pointers and sizes of one recipe-nvfp4 forward call. The operands are
// the NVFP4 quantizer's output expanded to BF16 without the tensor scales
// (cuda/sm90/fwd/nvfp4_bf16/expand.hpp): every element is E2M1 · UE4M3
// exactly, so the BF16 products are those of the NVFP4 values.
//   q  : bf16 (B, Hq, Sq, D), contiguous
//   k  : bf16 (B, Hkv, Sk, D), contiguous
//   vt : bf16 (B, Hkv, D, vt_keys), contiguous, keys ≥ Sk zero; vt_keys a
//        multiple of 32 (the quantizer's padded sequence)
// The three tensor scales S_enc (one device float each; a value decodes as
// element / S_enc) stay outside: 1/(S_q·S_k) joins the softmax scale in the
// score multiplier, 1/S_v multiplies O in the epilogue.
struct Nvfp4ForwardArgs {
  const void* q = nullptr;
  const void* k = nullptr;
  const void* vt = nullptr;
  std::int64_t vt_keys = 0;
  const float* q_tensor_scale = nullptr;
  const float* k_tensor_scale = nullptr;
  const float* v_tensor_scale = nullptr;
  const float* lse_shift = nullptr;  // (B, Hq, Sq) added to finite LSE (smooth_k), or null
  void* o = nullptr;                 // bf16 (B, Sq, Hq, D), element strides on B, S, H (even)
  std::int64_t o_stride_b = 0, o_stride_s = 0, o_stride_h = 0;
  float* lse = nullptr;  // (B, Hq, Sq), natural log
  // The quantizer's three non-finite flags (q, k, v), or null: when one is
  // set every O and LSE element written is NaN (as Fp8ForwardArgs::nonfinite).
  const int* nonfinite = nullptr;
  int B = 0, Hq = 0, Hkv = 0, Sq = 0, Sk = 0, D = 0;
  float softmax_scale = 0.0f;  // already resolved (> 0)
  MaskKind mask = MaskKind::none;
  // A sliding window (recipe.hpp's Window), -1 for no bound, as Fp8ForwardArgs.
  int window_left = -1, window_right = -1;
  bool direct_p = true;  // false: P by the exp2 baseline (ex2.approx, then the NVFP4 quantizer's rules)
};

// Launches the kernel for args.D (64 or 128) on `stream`. Throws fp4attn::Error
// naming the argument the kernel cannot take, and on CUDA errors.
void forward_nvfp4(const Nvfp4ForwardArgs& args, cudaStream_t stream);

}  // namespace fp4attn::sm90::fwd
