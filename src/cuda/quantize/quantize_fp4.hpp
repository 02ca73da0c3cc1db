// GPU quantizer for the FP4 recipes mxfp4, nvfp4 and mxfp4_train (DESIGN §2,
// §3.2): a bf16 / fp16 / fp32 (B, S, H, D) tensor with strides → packed E2M1
// codes and block-scale codes, bit for bit what fp4attn::quantize produces
// (with fp4attn::sequence_mean and subtract_sequence_mean for smooth_k).
//
// One call quantizes one operand; the operand fixes the block axis and the
// name errors use: q and k along D (the reduction dimension of QKᵀ), v along
// the sequence (that of PV). mxfp4_train quantizes q and k here and v with
// the FP8 quantizer.
//
// Layouts written (bytes; "codes" are E2M1 nibbles, element 2i of a row in
// the low nibble of byte i as fp4attn::pack_fp4; blk = 32 for MXFP4, 16 for
// NVFP4; S_pad = fp4_padded_tokens(S), S rounded up to a multiple of 32):
//   q, k codes  : (B, H, S, D/2)      one row of D/2 bytes per (b, h, token)
//   q, k scales : (B, H, S, D/blk)    E8M0 (MXFP4) or UE4M3 (NVFP4) codes
//   v codes     : transposed (default) (B, H, D, S_pad/2): one row of S_pad/2
//                 bytes per (b, h, channel), the sequence contiguous, as the
//                 K-major B operand of a P·V wgmma wants it;
//                 untransposed (B, H, S_pad, D/2)
//   v scales    : (B, H, S_pad/blk, D) either way: the scales of one key block
//                 are a row of D bytes
//   tensor_scale: NVFP4 only, one fp32 S_enc per operand (decode divides by it)
//   k_mean      : smooth_k only, (B, H, D) fp32, fp4attn::sequence_mean's order
// Padding: V tokens S .. S_pad − 1 hold code 0 (+0); a scale block that holds
// only padding tokens (NVFP4, when S mod 32 is in 1 .. 16) has scale code 0.
// A partly padded block's scale is that of its real tokens, as on the CPU.
//
// Why these layouts (for a Hopper kernel that loads FP4 with TMA and expands
// it to E4M3, DESIGN §3.4): every row of codes is a multiple of 16 bytes
// (D ≥ 32 for q and k; S_pad/2 for transposed V), so a (b, h) slice is a 2-D
// tensor map with a legal global stride; a 128-token tile's scales are one
// contiguous run ((B, H, S, D/blk) for q, k; (B, H, S_pad/blk, D) for v), one
// bulk copy.
//
// Work (NOTES-fp4.md): q and v are read once (MXFP4) and k once without
// smooth_k. NVFP4's S_enc needs the tensor's amax before the first code, so
// NVFP4 reads its input twice (an amax pass, then the quantize pass walking
// the tensor backwards so it starts on what L2 still holds); smooth_k reads K
// twice (the chunked mean, which also yields the NVFP4 amax of K − mean).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "cuda/quantize/quantize_fp8.hpp"  // ElementType, StridedInput
#include "fp4attn/recipe.hpp"

namespace fp4attn::cuda_quantize {

enum class Fp4Operand : std::uint8_t { q = 0, k = 1, v = 2 };

inline constexpr int kFp4TokenPad = 32;   // V's sequence is padded to a multiple of this
inline constexpr int kFp4MinHeadDim = 16;
inline constexpr int kFp4MaxHeadDim = 256;

struct Fp4Options {
  TensorFormat format = TensorFormat::mxfp4;  // mxfp4 or nvfp4
  MxScaleRule mx_scale_rule = MxScaleRule::round_up;
  bool smooth_k = false;      // k only: subtract the per-(b, h, d) sequence mean first
  bool v_transposed = true;   // v only: (B, H, D, S_pad/2) codes, else (B, H, S_pad, D/2)
};

// Device buffers of one operand (sizes from fp4_sizes).
struct Fp4Output {
  std::uint8_t* codes = nullptr;   // 4-byte aligned; 16-byte for transposed v
  std::uint8_t* scales = nullptr;
  float* tensor_scale = nullptr;   // NVFP4: one float
};

struct Fp4Buffers {
  Fp4Output q, k, v;
  float* k_mean = nullptr;  // (B, H, D) floats; needed for k with smooth_k
  // Three device ints (q, k, v): set to 1 when a tensor held a non-finite value.
  int* nonfinite = nullptr;
  // Optional scratch of fp4_workspace_bytes(...) bytes, any content; one call
  // at a time may use it. Null: each call allocates one, stream-ordered.
  void* workspace = nullptr;
};

struct Fp4Sizes {
  std::int64_t code_bytes = 0, scale_bytes = 0;
};

std::int64_t fp4_padded_tokens(std::int64_t S);
int fp4_block(TensorFormat format);  // 32 (MXFP4) or 16 (NVFP4)
Fp4Sizes fp4_sizes(Fp4Operand op, TensorFormat format, std::int64_t B, std::int64_t S, std::int64_t H,
                   std::int64_t D);
// Scratch for any operand of shape (B, S, H, D).
std::size_t fp4_workspace_bytes(std::int64_t B, std::int64_t S, std::int64_t H, std::int64_t D);

// Quantizes x as operand `op` into out.{q,k,v} on `stream` (asynchronous).
// D a power of two in [16, 256] (MXFP4 q, k: at least 32, one block).
void quantize_fp4(const StridedInput& x, Fp4Operand op, const Fp4Options& options, const Fp4Buffers& out,
                  cudaStream_t stream);

// Synchronizes `stream` and throws fp4attn::Error naming q, k or v if the
// quantizer saw a non-finite value in it; clears the flags.
void check_finite(const Fp4Buffers& out, cudaStream_t stream);

}  // namespace fp4attn::cuda_quantize
