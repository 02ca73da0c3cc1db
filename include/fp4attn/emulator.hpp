// CPU emulator: the tiled online-softmax algorithm of the kernels, with the
// kernels' quantized operands and Direct-P codes, for a chosen target.
#pragma once

#include <span>
#include <vector>

#include "fp4attn/quantize.hpp"
#include "fp4attn/recipe.hpp"
#include "fp4attn/tensor.hpp"

namespace fp4attn::emulator {

// Q, K, V after quantization, as the kernel receives them.
struct QuantizedInputs {
  QuantizedTensor q, k, v;
  std::vector<float> k_mean;  // (B, Hkv, D) when smooth_k, else empty
};

QuantizedInputs quantize_inputs(const AttentionShape& shape, std::span<const float> q, std::span<const float> k,
                                std::span<const float> v, const AttentionOptions& opt);

struct ForwardResult {
  std::vector<float> o;    // (B, Sq, Hq, D), rounded to bf16 as the kernels store it
  std::vector<float> lse;  // (B, Hq, Sq), natural log of the row sum actually used; -inf if fully masked
};

ForwardResult forward(const AttentionShape& shape, const QuantizedInputs& in, const AttentionOptions& opt);
ForwardResult forward(const AttentionShape& shape, std::span<const float> q, std::span<const float> k,
                      std::span<const float> v, const AttentionOptions& opt);

struct BackwardResult {
  std::vector<float> dq, dk, dv;
};

// FP8 backward (recipes fp8 and mxfp4_train; DESIGN §5), from the forward's
// inputs, output and LSE.
BackwardResult backward(const AttentionShape& shape, std::span<const float> q, std::span<const float> k,
                        std::span<const float> v, std::span<const float> o, std::span<const float> lse,
                        std::span<const float> d_o, const AttentionOptions& opt);

}  // namespace fp4attn::emulator
