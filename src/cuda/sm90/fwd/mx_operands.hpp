// Device storage and preparation of one MXFP4-recipe forward problem on sm90:
// the GPU MXFP4 quantizer's output, and the E4M3 operands and fold factors
// the FP8 forward kernel reads (DESIGN §3.4). Two ways to E4M3 (Fp4Expansion):
// a fold pass before the kernel, whose E4M3 operands the kernel reads (HBM
// traffic of the fp8 recipe), or, recipe mxfp4 only, the kernel reads the
// MXFP4 codes and expands them itself (4.25 bits per element; a pass over the
// scales alone writes the fold factors). The bytes that reach the tensor
// cores are the same either way.
//
//   recipe mxfp4_train: Q, K MXFP4 → folded (Q per row, K per 128-key tile);
//                       V FP8 by the fp8 quantizer; P E4M3 (Direct-P or exp2)
//   recipe mxfp4:       Q, K as above; V MXFP4 folded per channel over the
//                       sequence; P FP4 (PCode::mxfp4_direct_p or mxfp4_exp2)
#pragma once

#include <cstddef>

#include "cuda/common/device_memory.hpp"
#include "cuda/quantize/quantize_fp4.hpp"
#include "cuda/quantize/quantize_fp8.hpp"
#include "cuda/sm90/fwd/fp8_operands.hpp"  // contiguous_forward_args
#include "cuda/sm90/fwd/fwd.hpp"
#include "fp4attn/recipe.hpp"
#include "fp4attn/tensor.hpp"

namespace fp4attn::sm90::fwd {

// Where recipe mxfp4's MXFP4 Q, K and V become E4M3.
enum class Fp4Expansion : std::uint8_t {
  fold_pass,  // cuda/quantize/fold_mx.hpp writes folded E4M3 operands; the kernel loads them by TMA
  in_kernel,  // the kernel's producer warpgroup expands MXFP4 tiles (fp8_direct_p/fp4_expand.cuh)
};

// Where a training forward (recipe mxfp4_train) keeps what its backward
// reads (dispatch's saved block): Q's MXFP4 codes and scales, K folded per
// 128-key tile with its transposed copy (keys permuted as Vᵀ's) and factors,
// K's smooth_k mean, the LSE shift and the three non-finite flags.
struct MxKept {
  std::uint8_t *q_codes = nullptr, *q_scales = nullptr, *k = nullptr, *kt = nullptr;
  float *k_scale = nullptr, *k_mean = nullptr, *lse_shift = nullptr;
  int* nonfinite = nullptr;
};

class MxOperands {
 public:
  // Device bytes of every buffer of one call (MXFP4 codes and scales, folded
  // operands, FP8 V for mxfp4_train, the quantizers' scratch), each region
  // 256-byte aligned: what a caller-provided workspace must hold.
  static std::size_t workspace_bytes(const AttentionShape& shape, Recipe recipe,
                                     Fp4Expansion expansion = Fp4Expansion::fold_pass);

  // Owns one allocation of workspace_bytes (so that timed calls allocate
  // nothing). recipe: mxfp4 or mxfp4_train; mx_scale_rule: the MX block-scale
  // rule of the quantizer and of exp2 P; expansion: in_kernel needs recipe mxfp4.
  MxOperands(const AttentionShape& shape, Recipe recipe, MxScaleRule mx_scale_rule = MxScaleRule::round_up,
             Fp4Expansion expansion = Fp4Expansion::fold_pass);
  // Carves every buffer from `workspace` (at least workspace_bytes device
  // bytes, 256-byte aligned, any content), which the caller keeps alive: the
  // zero-copy device path.
  MxOperands(const AttentionShape& shape, Recipe recipe, MxScaleRule mx_scale_rule, void* workspace,
             Fp4Expansion expansion = Fp4Expansion::fold_pass);

  // Recipe mxfp4_train, fold pass: the buffers `kept` names replace the
  // workspace's, and the fold of K also writes Kᵀ there. Call before prepare.
  void keep_for_backward(const MxKept& kept);

  // Clears the non-finite flags, quantizes q, k, v on `stream` and folds them
  // into the kernel's operands (asynchronous). With smooth_k, K's sequence
  // mean is subtracted before quantizing and the LSE correction for
  // `softmax_scale` is computed.
  void prepare(const cuda_quantize::StridedInput& q, const cuda_quantize::StridedInput& k,
               const cuda_quantize::StridedInput& v, bool smooth_k, float softmax_scale, cudaStream_t stream);
  // The step of prepare after the quantizers: the folds (factors only when
  // in_kernel) and smooth_k's LSE correction. What a caller that keeps the
  // MXFP4 operands (a cache) runs before each kernel call.
  void fold(bool smooth_k, float softmax_scale, cudaStream_t stream);
  // Synchronizes `stream`; throws fp4attn::Error naming q, k or v if one held a non-finite value.
  void check_finite(cudaStream_t stream) const;

  // Kernel arguments (the caller sets o with its strides, and lse). The
  // kernel reads the non-finite flags: a flagged input makes O and LSE NaN.
  Fp8ForwardArgs forward_args(MaskKind mask, bool direct_p, float softmax_scale, bool smooth_k) const;
  // Device bytes of operand codes the kernel reads per call: the folded Q, K
  // and Vᵀ E4M3 codes, or (in_kernel) the MXFP4 codes and their scales.
  std::size_t kernel_code_bytes() const;
  Fp4Expansion expansion() const { return expansion_; }

 private:
  void carve(unsigned char* base);

  AttentionShape shape_;
  Recipe recipe_;
  MxScaleRule mx_scale_rule_;
  Fp4Expansion expansion_;
  cuda_common::DeviceMemory owned_;
  cuda_quantize::Fp4Buffers fp4_;     // MXFP4 codes and scales (v unused for mxfp4_train)
  cuda_quantize::Fp8Buffers fp8_v_;   // mxfp4_train: the fp8 quantizer's Vᵀ and v_scale
  cuda_quantize::Fp8Buffers folded_;  // what the kernel reads (q_scale per row); factors only when in_kernel
  std::uint8_t* kt_ = nullptr;        // keep_for_backward: K's folded codes transposed
};

}  // namespace fp4attn::sm90::fwd
