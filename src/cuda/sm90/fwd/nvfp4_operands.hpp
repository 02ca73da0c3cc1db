// Device storage and preparation of one NVFP4-recipe forward problem on sm90:
// the GPU NVFP4 quantizer's output, and the BF16 operands the NVFP4 forward
// kernel reads (DESIGN §3.4), expanded by a pre-pass
// (cuda/sm90/fwd/nvfp4_bf16/expand.hpp). The kernel reads BF16, so its HBM
// traffic is four times the FP4 codes'.
#pragma once

#include <cstddef>

#include "cuda/common/device_memory.hpp"
#include "cuda/quantize/quantize_fp4.hpp"
#include "cuda/sm90/fwd/nvfp4_fwd.hpp"
#include "fp4attn/recipe.hpp"
#include "fp4attn/tensor.hpp"

namespace fp4attn::sm90::fwd {

class Nvfp4Operands {
 public:
  // Device bytes of every buffer of one call (NVFP4 codes, scales and tensor
  // scales, the BF16 operands, the LSE shift, the quantizer's scratch), each
  // region 256-byte aligned: what a caller-provided workspace must hold.
  static std::size_t workspace_bytes(const AttentionShape& shape);

  // Owns one allocation of workspace_bytes (so that timed calls allocate nothing).
  explicit Nvfp4Operands(const AttentionShape& shape);
  // Carves every buffer from `workspace` (at least workspace_bytes device
  // bytes, 256-byte aligned, any content), which the caller keeps alive.
  Nvfp4Operands(const AttentionShape& shape, void* workspace);

  // Clears the non-finite flags, quantizes q, k, v to NVFP4 on `stream` and
  // expands them to BF16 (asynchronous). With smooth_k, K's sequence mean is
  // subtracted before quantizing and the LSE correction for `softmax_scale`
  // is computed.
  void prepare(const cuda_quantize::StridedInput& q, const cuda_quantize::StridedInput& k,
               const cuda_quantize::StridedInput& v, bool smooth_k, float softmax_scale, cudaStream_t stream);
  // Synchronizes `stream`; throws fp4attn::Error naming q, k or v if one held a non-finite value.
  void check_finite(cudaStream_t stream) const;

  // Kernel arguments (the caller sets o with its strides, and lse).
  Nvfp4ForwardArgs forward_args(MaskKind mask, bool direct_p, float softmax_scale, bool smooth_k) const;
  // The quantizer's output (tests compare it and the BF16 operands with the emulator's).
  const cuda_quantize::Fp4Buffers& fp4() const { return fp4_; }
  // Device bytes the kernel reads per call: the BF16 Q, K and Vᵀ.
  std::size_t kernel_operand_bytes() const;

 private:
  void carve(unsigned char* base);

  AttentionShape shape_;
  cuda_common::DeviceMemory owned_;
  cuda_quantize::Fp4Buffers fp4_;
  void* q_ = nullptr;   // bf16 (B, Hq, Sq, D)
  void* k_ = nullptr;   // bf16 (B, Hkv, Sk, D)
  void* vt_ = nullptr;  // bf16 (B, Hkv, D, vt_keys_)
  std::int64_t vt_keys_ = 0;
  float* lse_shift_ = nullptr;
};

}  // namespace fp4attn::sm90::fwd
