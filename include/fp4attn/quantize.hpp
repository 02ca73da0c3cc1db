// Host quantizers (DESIGN §3.2): FP8 with fp32 block scales, MXFP4, NVFP4, and
// the smooth_k mean subtraction. The GPU quantizers must match these bit for bit.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "fp4attn/formats.hpp"
#include "fp4attn/recipe.hpp"

namespace fp4attn {

// Elements per block scale (DESIGN §2): OCP MX uses 32, NVFP4 16.
inline constexpr int kMxfp4Block = 32;
inline constexpr int kNvfp4Block = 16;

// Which dimension the scale blocks run along: the reduction dimension of the
// product that consumes the tensor (Q, K: D for QKᵀ; V: the sequence for PV).
enum class BlockAxis : std::uint8_t { along_d, along_s };

// Logical (B, S, H, D) tensor of codes, one code per byte (FP4 unpacked; see
// pack_fp4 for the memory format), with its scales.
struct QuantizedTensor {
  TensorFormat format = TensorFormat::fp8_e4m3;
  BlockAxis axis = BlockAxis::along_d;
  std::int64_t B = 0, S = 0, H = 0, D = 0;
  int block = 0;                 // elements (or tokens, for FP8 Q/K) per scale
  std::vector<std::uint8_t> codes;  // B*S*H*D codes
  // Scale layout, by format and axis:
  //   fp8 along_d: (B, H, ceil(S/block)) fp32    fp8 along_s: (B, H, D) fp32
  //   mx/nv along_d: (B, S, H, D/block)          mx/nv along_s: (B, ceil(S/block), H, D)
  std::vector<float> scales;              // decoded scale values (fp8: the fp32 scale)
  std::vector<std::uint8_t> scale_codes;  // E8M0 (mxfp4) or UE4M3 (nvfp4) codes; empty for fp8
  float tensor_scale = 1.0f;              // NVFP4 S_enc; decode divides by it

  std::int64_t numel() const { return B * S * H * D; }
  std::int64_t scale_index(std::int64_t b, std::int64_t s, std::int64_t h, std::int64_t d) const;
  // The value the code stands for: code · scale (/ tensor_scale for NVFP4).
  float value(std::int64_t b, std::int64_t s, std::int64_t h, std::int64_t d) const;
  std::vector<float> dequantize() const;
};

struct QuantizeOptions {
  int fp8_token_block = 128;  // FP8 along_d: tokens per scale (the kernel's tile)
  MxScaleRule mx_scale_rule = MxScaleRule::round_up;
};

// Quantize a contiguous (B, S, H, D) fp32 tensor. `name` is used in errors
// (non-finite values, bad sizes) so the caller learns which argument was bad.
QuantizedTensor quantize(std::span<const float> x, std::int64_t B, std::int64_t S, std::int64_t H, std::int64_t D,
                         TensorFormat format, BlockAxis axis, const QuantizeOptions& opt, const std::string& name);

// Block-scale rules, exposed for tests and the GPU quantizers' reference.
// E8M0 code of the MX scale for a block with maximum |x| = amax.
std::uint8_t mx_scale_code(float amax, MxScaleRule rule);
// NVFP4 per-tensor encode scale S_enc = 2688 / amax (1 when amax is 0).
float nvfp4_tensor_scale(float tensor_amax);
// NVFP4 block scale code e4m3_rne_sat(block_amax · S_enc / 6).
std::uint8_t nvfp4_block_scale_code(float block_amax, float tensor_scale);
// FP8 block scale amax / 448 (1 when amax is 0).
float fp8_block_scale(float amax);

// Tokens per partial sum of the smooth_k mean.
inline constexpr int kSequenceMeanChunk = 128;

// smooth_k: per-(b, h, d) mean of K over the sequence, summed in double and
// rounded to float. Returns (B, H, D). The smoothed tensor is k − mean in fp32.
// Summation order: chunks of kSequenceMeanChunk tokens, ascending s within a
// chunk, then the chunk sums added in ascending chunk order; the total is
// divided by S in double. Chunks can be summed in parallel, so the GPU
// quantizer evaluates this very order and matches bit for bit.
std::vector<float> sequence_mean(std::span<const float> k, std::int64_t B, std::int64_t S, std::int64_t H,
                                 std::int64_t D);
std::vector<float> subtract_sequence_mean(std::span<const float> k, std::span<const float> mean, std::int64_t B,
                                          std::int64_t S, std::int64_t H, std::int64_t D);

// Throws fp4attn::Error naming `name` at the first non-finite element.
void require_finite(std::span<const float> x, const std::string& name);

// FP4 memory format: two codes per byte, element 2i in the low nibble.
std::vector<std::uint8_t> pack_fp4(std::span<const std::uint8_t> codes);
std::vector<std::uint8_t> unpack_fp4(std::span<const std::uint8_t> packed, std::int64_t count);

}  // namespace fp4attn
