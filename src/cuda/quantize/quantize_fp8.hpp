// GPU quantizer for recipe fp8 (DESIGN §2): bf16 / fp16 / fp32 (B, S, H, D)
// tensors with strides → E4M3 codes and fp32 scales, bit for bit what the CPU
// quantizer (fp4attn::quantize, emulator::quantize_inputs) produces.
//
// Layouts written:
//   q, k : (B, S, H, D) codes, each (b, s, h) row code_pitch bytes after the
//          last (D unless set); scale per (b, h, 128-token block)
//   vt   : (B, Hkv, D, vt_keys) codes, V transposed, keys padded with zero
//          codes to a multiple of 128 and permuted inside each group of 32 by
//          vt_key_of_slot (the order in which the forward kernel's P operand
//          holds keys, so P never needs a register shuffle); scale per (b, h, d)
//   qt, kt : on request, (B, H, D, padded_keys(S)) codes, Q's and K's codes
//          transposed in Vᵀ's token order (the backward's operands)
//   k_mean    : (B, Hkv, D) smooth_k mean, fp4attn::sequence_mean's order
//   lse_shift : (B, Hq, Sq) softmax_scale · Σ_d q_deq · k_mean, the LSE
//               correction that smooth_k makes necessary
//
// Three launches (quantize_fp8_kernel.cuh): the statistics of K and V, then
// k_mean and the V scales, then every block's codes. Q is read once, K and V
// twice (the statistics must be final before the first code).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace fp4attn::cuda_quantize {

enum class ElementType : std::uint8_t { f32, f16, bf16 };

// A device tensor (B, S, H, D), D contiguous, strides in elements.
struct StridedInput {
  const void* data = nullptr;
  ElementType type = ElementType::bf16;
  std::int64_t B = 0, S = 0, H = 0, D = 0;
  std::int64_t stride_b = 0, stride_s = 0, stride_h = 0;
  // Packed sequences of different lengths (FlashAttention's varlen batches):
  // B + 1 device ints; batch entry b is token rows cu_seqlens[b] ..
  // cu_seqlens[b + 1] − 1 of the tensor, stride_b is not used, and S is the
  // longest sequence, the length the outputs are laid out for (quantize_fp8
  // says what each sequence gets). Null: every entry has S tokens.
  const int* cu_seqlens = nullptr;
};

// Device buffers the quantizer fills (sizes in the header comment).
struct Fp8Buffers {
  std::uint8_t* q = nullptr;
  float* q_scale = nullptr;
  std::uint8_t* k = nullptr;
  float* k_scale = nullptr;
  std::uint8_t* vt = nullptr;
  float* v_scale = nullptr;
  float* k_mean = nullptr;     // needed when smooth_k
  float* lse_shift = nullptr;  // needed when smooth_k
  std::int64_t vt_keys = 0;
  // Three device ints (q, k, v): set to 1 when a tensor held a non-finite value.
  int* nonfinite = nullptr;
  // Optional scratch of fp8_workspace_bytes(...) device bytes, any content (the
  // quantizer resets what it needs on `stream`); one call at a time may use it.
  // Null: each call allocates one, stream-ordered.
  void* workspace = nullptr;
  // Optional transposed copies of the q and k codes, (B, H, D, padded_keys(S))
  // in Vᵀ's token order (vt_key_of_slot inside each group of 32, zero codes
  // past S): the token-major operands of the backward's gradient products,
  // written from the block the CTA already holds instead of a second pass
  // over the codes. Null: not written.
  std::uint8_t* qt = nullptr;
  std::uint8_t* kt = nullptr;
  // Bytes from one (b, s, h) row of the q and k codes to the next: 0 means D.
  // At least D and a multiple of 8; D with the backward's operands (qt, kt).
  // The forward kernel reads the codes by TMA, whose row strides are multiples
  // of 16 bytes: tma_code_pitch(D).
  std::int64_t code_pitch = 0;
  // Packed sequences (cu_seqlens): the tile-aligned layout of
  // cuda/common/packed_rows.hpp. rows_q, rows_k: B + 1 device ints
  // (check_packed_sequences), sequence b's first row; q_rows, k_rows: the layout's
  // rows (packed_layout_rows). Every per-token output is then laid out as
  // for one batch entry of that many tokens (q, k: (1, q_rows, H, D); qt,
  // kt: (1, H, D, rows); vt_keys = k_rows; scales (1, H, rows / 128);
  // lse_shift (1, Hq, q_rows)), and sequence b's tokens take its rows from
  // rows_q[b] (rows_k[b]) on. The per-sequence arrays (k_mean, v_scale)
  // keep (B, Hkv, D).
  const int* rows_q = nullptr;
  const int* rows_k = nullptr;
  std::int64_t q_rows = 0, k_rows = 0;
};

inline constexpr int kTokenBlock = 128;  // FP8 Q/K scale block, the kernel's tile
inline constexpr int kVtKeyGroup = 32;   // keys per wgmma k-step; the permutation repeats per group

// Key stored at slot `slot` of a 32-key group of Vᵀ: slot 16h + 4c + i holds
// key 16h + 2c + (i & 1) + 8·(i >> 1). See pack_p_operand in the kernel.
constexpr int vt_key_of_slot(int slot) {
  const int h = slot / 16, c = (slot % 16) / 4, i = slot % 4;
  return 16 * h + 2 * c + (i & 1) + 8 * (i >> 1);
}

std::int64_t padded_keys(std::int64_t Sk);

// The row pitch of q and k codes that TMA can address: D rounded up to 16
// bytes (D = 40 and 72 give 48 and 80; the bytes past D are never read).
inline constexpr std::int64_t kTmaStrideAlign = 16;
constexpr std::int64_t tma_code_pitch(std::int64_t D) {
  return (D + kTmaStrideAlign - 1) / kTmaStrideAlign * kTmaStrideAlign;
}

// Bytes of q or k codes of `elems` elements (rows of D) at tma_code_pitch(D).
constexpr std::int64_t tma_code_bytes(std::int64_t elems, std::int64_t D) { return elems / D * tma_code_pitch(D); }

// The row pitch `out` gives its q and k codes.
inline std::int64_t code_pitch_of(const Fp8Buffers& out, std::int64_t D) {
  return out.code_pitch != 0 ? out.code_pitch : D;
}

// Device bytes of Fp8Buffers::workspace for K and V of shape (B, Sk, Hkv, D);
// packed sequences give k_rows, Fp8Buffers::k_rows.
std::size_t fp8_workspace_bytes(std::int64_t B, std::int64_t Hkv, std::int64_t Sk, std::int64_t D,
                                std::int64_t k_rows = 0);

// Quantizes q, k, v into `out` on `stream` (asynchronous). q is (B, Sq, Hq, D),
// k and v (B, Sk, Hkv, D), all of one element type, D a multiple of 8 (a
// power of two with the backward's operands) in
// [16, 128], Hq a multiple of Hkv. With smooth_k, K's per-(b, h, d) mean is
// subtracted first and out.lse_shift receives the LSE correction for
// `softmax_scale`. With out.q and out.k both null only V is quantized (Vᵀ and
// v_scale; smooth_k must be off): recipe mxfp4_train quantizes Q and K to
// MXFP4 elsewhere, and q, k then serve only to check the shapes. With out.vt
// null V is not quantized (no Vᵀ, no v_scale, no V statistics; v serves only
// to check the shapes): the backward needs Q and K exactly as the forward
// quantized them, and V only per token block, which it gets as a "k".
// Packed sequences (q.cu_seqlens, and one cu_seqlens shared by k and v; S
// the longest): the outputs take the tile-aligned layout of out.rows_q,
// out.rows_k, and entry b's statistics (the smooth_k mean, V's channel
// scales), block scales and codes are those of a call on its own tokens,
// bit for bit; its rows past its length, up to its last block's end, are
// zero codes (the row dot: 0).
void quantize_fp8(const StridedInput& q, const StridedInput& k, const StridedInput& v, bool smooth_k,
                  float softmax_scale, const Fp8Buffers& out, cudaStream_t stream);

// Optional companion of q for quantize_fp8: a tensor `with` of q's shape,
// element type and cu_seqlens, and an fp32 output `out` of (B, Hq, pitch)
// rows with pitch at least Sq rounded up to 128 (packed sequences: one entry
// of out.q_rows rows, pitch = q_rows). The quantizer writes
// out[b, h, s] = Σ_d q[b, s, h, d]·with[b, s, h, d] (fp32 products and sums:
// eight channels in order, then a tree over the row's lanes) for every s
// below that rounded length, 0 past Sq (packed: below the entry's length
// rounded up, 0 past its length). The backward's delta = Σ dO·O, taken while
// its call holds dO's blocks in registers, so dO is read once.
struct QRowDot {
  StridedInput with;
  float* out = nullptr;
  std::int64_t pitch = 0;
};

void quantize_fp8(const StridedInput& q, const StridedInput& k, const StridedInput& v, bool smooth_k,
                  float softmax_scale, const Fp8Buffers& out, const QRowDot& q_row_dot, cudaStream_t stream);

// Synchronizes `stream` and throws fp4attn::Error naming q, k or v if the
// quantizer saw a non-finite value in it; clears the flags.
void check_finite(const Fp8Buffers& out, cudaStream_t stream);

}  // namespace fp4attn::cuda_quantize
