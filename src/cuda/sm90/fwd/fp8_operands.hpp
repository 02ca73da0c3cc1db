// Device storage of one recipe-fp8 forward problem's quantized operands: what
// the GPU quantizer writes and the kernel reads, sized in one place.
#pragma once

#include <vector>

#include "cuda/common/device_memory.hpp"
#include "cuda/quantize/quantize_fp8.hpp"
#include "cuda/sm90/fwd/fwd.hpp"
#include "fp4attn/tensor.hpp"

namespace fp4attn::sm90::fwd {

// Kernel arguments over quantized operands stored as (B, S, H, D) codes in
// rows of bufs.code_pitch bytes (what the GPU quantizer writes); the caller
// sets o (with its strides) and lse.
Fp8ForwardArgs contiguous_forward_args(const AttentionShape& shape, const cuda_quantize::Fp8Buffers& bufs,
                                       MaskKind mask, PCode p_code, float softmax_scale, bool smooth_k);

class Fp8Operands {
 public:
  // Allocates every buffer of cuda_quantize::Fp8Buffers, the quantizer's
  // workspace included (so that timed calls allocate nothing), and zeroes the
  // non-finite flags. Throws fp4attn::Error("cuda", ...) when memory runs out.
  explicit Fp8Operands(const AttentionShape& shape);

  const cuda_quantize::Fp8Buffers& buffers() const { return bufs_; }
  // Device bytes the kernel reads per call: Q, K and Vᵀ codes.
  std::size_t code_bytes() const;
  // contiguous_forward_args over these operands.
  Fp8ForwardArgs forward_args(MaskKind mask, PCode p_code, float softmax_scale, bool smooth_k) const {
    return contiguous_forward_args(shape_, bufs_, mask, p_code, softmax_scale, smooth_k);
  }

 private:
  void* allocate(std::size_t bytes);

  AttentionShape shape_;
  std::vector<cuda_common::DeviceMemory> owned_;
  cuda_quantize::Fp8Buffers bufs_;
};

}  // namespace fp4attn::sm90::fwd
