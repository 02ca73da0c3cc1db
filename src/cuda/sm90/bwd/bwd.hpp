// Host-side entry of the sm90 FP8 backward kernels (recipe fp8, DESIGN §5):
// argument blocks and launchers. No device code here, so dispatch can include
// it from .cpp files.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "cuda/quantize/quantize_fp8.hpp"
#include "cuda/sm90/fwd/fwd.hpp"
#include "fp4attn/recipe.hpp"

namespace fp4attn::sm90::bwd {

using fwd::PCode;
using cuda_quantize::ElementType;

// Tokens per tile and per FP8 scale block; transposed operands pad their
// token rows to a multiple of it.
inline constexpr int kTile = 128;

inline std::int64_t padded_tokens(std::int64_t S) { return (S + kTile - 1) / kTile * kTile; }

// DqMode::two_pass: dS scales per (query tile, key tile) pair, one per
// 64-query half (a consumer warpgroup of the dQ kernel).
inline constexpr int kDsScalesPerPair = 2;

// Packed sequences' tile-aligned layout (cuda/common/packed_rows.hpp): every
// operand and statistic is one batch entry of q_rows (k_rows) tokens, and
// sequence b's tokens start at row q[b] (k[b]), a multiple of kTile. Null:
// the dense (B, S) layouts.
struct PackedRows {
  const int* q = nullptr;
  const int* k = nullptr;
  int q_rows = 0, k_rows = 0;
};

// A (B, S, H, D) device tensor of `type`, element strides on B, S, H, D contiguous.
struct TensorRef {
  void* data = nullptr;
  std::int64_t stride_b = 0, stride_s = 0, stride_h = 0;
};

// How dQ is summed over key tiles.
enum class DqMode : std::uint8_t {
  two_pass,  // a dQ kernel owns each query tile: deterministic (the default)
  one_pass,  // the dK/dV kernel adds each pair's dQ tile to fp32 sums by bulk
             // reductions from shared memory, then finalize_dq scales them:
             // run-to-run bit differences in dQ (NOTES.md says when it is faster)
};

// DqMode::one_pass's fp32 sums of dQ: (B, Hq, padded_tokens(Sq), D), where
// element d of row s sits at column d ^ (8·(s % 8)). A consumer's 64
// accumulator rows then go to shared memory without bank conflicts and leave
// it as one contiguous block (a single bulk reduction); finalize_dq undoes
// the permutation. Padding rows take sums of zero dS (masked queries).
inline std::int64_t dq_accum_elems(std::int64_t B, std::int64_t Hq, std::int64_t Sq, std::int64_t D) {
  return B * Hq * padded_tokens(Sq) * D;
}
inline constexpr int dq_accum_column(int row, int column) { return column ^ (8 * (row & 7)); }

// Device pointers of one backward call. Codes are what the GPU quantizer
// writes: q, d_o (B, Sq, Hq, D) and k, v (B, Sk, Hkv, D) contiguous E4M3 with
// one fp32 scale per (b, h, 128-token block); the transposed copies are
// (B, H, D, padded_tokens(S)) with tokens permuted inside each group of 32 by
// cuda_quantize::vt_key_of_slot (the order of an FP8 wgmma A operand built
// from an accumulator). Row statistics are (B, Hq, padded_tokens(Sq)).
struct Fp8BackwardArgs {
  const std::uint8_t *q = nullptr, *k = nullptr, *d_o = nullptr, *v = nullptr;
  const std::uint8_t *qt = nullptr, *d_ot = nullptr, *kt = nullptr;
  const float *q_scale = nullptr, *k_scale = nullptr, *do_scale = nullptr, *v_scale = nullptr;
  const float* lse_log2 = nullptr;  // log2-domain LSE of the smoothed scores; +inf: the row sees no key
  const float* delta = nullptr;     // rowsum(dO ⊙ O)
  float* dq_accum = nullptr;  // DqMode::one_pass: dq_accum_elems fp32 in that layout, zero before the call
  // DqMode::two_pass: the dS scales of every (query tile, key tile) pair,
  // (B, Hq, query tiles, key tiles, kDsScalesPerPair) fp32: each 64-query
  // half's amax / 448 (0 for an all-zero half). The dQ kernel quantizes each
  // half's dS with its own (1 for 0) and writes both; the dK/dV kernel takes
  // the larger as the pair's (its dSᵀ spans both halves along the sum over
  // queries) instead of reducing the same amax again.
  float* ds_scales = nullptr;
  DqMode dq_mode = DqMode::two_pass;
  ElementType out_type = ElementType::f32;
  TensorRef dq, dk, dv;
  int B = 0, Hq = 0, Hkv = 0, Sq = 0, Sk = 0, D = 0;
  // Packed sequences (FlashAttention's varlen batches), or null: B + 1 device
  // ints each; entry b has cu_seqlens_q[b + 1] − cu_seqlens_q[b] queries and
  // as many keys as cu_seqlens_k gives it, and Sq, Sk are the longest (the
  // grids). Every operand and statistic above takes the tile-aligned layout
  // of `rows` (v_scale per token block, as k_scale; the dS scales per query
  // tile of that layout and key tile of the longest: (Hq, q_rows / 128,
  // ⌈Sk / 128⌉, 2)). dq is then written at token rows cu_seqlens_q[b] .., dk
  // and dv at cu_seqlens_k[b] .. (stride_b not used). Each entry's gradients
  // are those of a call on it alone.
  const int* cu_seqlens_q = nullptr;
  const int* cu_seqlens_k = nullptr;
  PackedRows rows;
  float softmax_scale = 0.0f;  // resolved (> 0)
  MaskKind mask = MaskKind::none;
  int window_left = -1, window_right = -1;  // a sliding window (recipe.hpp's Window), -1 for no bound
  PCode p_code = PCode::direct_p;
};


// The backward's log2-domain LSE per row: lse_log2 = (lse − shift)·log2 e,
// or +inf where lse is −inf (a row that sees no key); shift may be null (no
// smooth_k). Padding rows get +inf. delta (Σ_d dO·O, written before by the
// dO quantizer call) becomes NaN where lse is NaN, lse_log2 0 there. lse is
// (B, Hq, Sq), or for packed sequences (cu_seqlens_q, B + 1 device ints)
// (Hq, lse_pitch) with entry b's rows from column cu_seqlens_q[b]; shift,
// delta and lse_log2 then take the tile-aligned layout of `rows` ((Hq,
// rows.q_rows), entry b from rows.q[b]; rows past the last entry's tiles
// get +inf too).
void lse_statistics(const float* lse, const float* shift, float* delta, float* lse_log2, int B, int Sq, int Hq,
                    const int* cu_seqlens_q, std::int64_t lse_pitch, const PackedRows& rows, cudaStream_t stream);

// One scale array of nan_scales_if_flagged: dst receives src (src null:
// dst keeps its values), or NaN.
struct ScaleArray {
  float* dst = nullptr;
  const float* src = nullptr;
  std::int64_t count = 0;
};

// The scale arrays a, b, c the gradient products read: each dst receives
// its src, or NaN everywhere when one of the `flag_count` device ints at
// `flags` or the `more_count` at `more_flags` (may be null) is set. The
// MXFP4 quantizer turns a non-finite input into finite codes (NaN and Inf
// come out as the largest magnitudes), so without this a flagged input would
// give finite, wrong gradients; with NaN Q, K and dO scales every gradient
// product is NaN, so dQ, dK and dV are NaN wherever a visible (query, key)
// pair contributes, and no host synchronisation is needed. The copy lets a
// backward on the forward's saved operands poison its own scales, never the
// saved block.
void nan_scales_if_flagged(const int* flags, int flag_count, const int* more_flags, int more_count, ScaleArray a,
                           ScaleArray b, ScaleArray c, cudaStream_t stream);

// dq = scale · accum (DqMode::one_pass's layout, dq_accum_elems) into `dq` of `type`;
// for packed sequences (cu_seqlens_q not null; accum in the tile-aligned
// layout of `rows`, (Hq, rows.q_rows, D)) entry b's rows below its length,
// at token rows cu_seqlens_q[b] ...
void finalize_dq(const float* accum, ElementType type, const TensorRef& dq, float scale, int B, int Sq, int Hq, int D,
                 const int* cu_seqlens_q, const PackedRows& rows, cudaStream_t stream);

// The two deterministic passes: dQ (one CTA per query tile) and dK, dV (one
// CTA per key tile of a KV head, over its whole GQA group). Throws
// fp4attn::Error for arguments the kernels cannot take and on CUDA errors.
// DqMode::one_pass runs the dK/dV kernel alone, adding dQ to fp32 sums, then finalize_dq.
void backward_fp8(const Fp8BackwardArgs& args, cudaStream_t stream);

}  // namespace fp4attn::sm90::bwd
