// Recipe fp8's forward operands from tensors the caller has already quantized
// to E4M3 (FlashAttention-3's FP8 interface: codes with one fp32 descale per
// batch entry and key/value head). The kernel reads Q's and K's codes where
// they are; this pass writes what else it reads:
//   q_scale (B, Hq, ceil(Sq / 128)), k_scale (B, Hkv, ceil(Sk / 128)),
//   v_scale (B, Hkv, D): the descales broadcast (1 where none is given);
//   vt (B, Hkv, D, padded_keys(Sk)): V's codes transposed in the kernel's key
//   order (quantize_fp8.hpp's Vᵀ layout), zero codes past Sk.
// A NaN code (E4M3 has no infinities) in q, k or v, or a descale that is not
// finite and positive, raises that tensor's flag in `nonfinite` (q, k, v),
// which makes the kernel write NaN into every O and LSE element.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace fp4attn::sm90::fwd {

// E4M3 codes (B, S, H, D) with strides in elements (bytes) on B, S and H; D contiguous.
struct E4m3View {
  const std::uint8_t* data = nullptr;
  std::int64_t stride_b = 0, stride_s = 0, stride_h = 0;
};

struct E4m3CallerInputs {
  E4m3View q, k, v;
  const float* q_descale = nullptr;  // (B, Hkv) each, contiguous, or null for 1
  const float* k_descale = nullptr;
  const float* v_descale = nullptr;
  int B = 0, Hq = 0, Hkv = 0, Sq = 0, Sk = 0, D = 0;  // D a multiple of 16
};

struct E4m3KernelOperands {
  float* q_scale = nullptr;
  float* k_scale = nullptr;
  float* v_scale = nullptr;
  std::uint8_t* vt = nullptr;  // vt_keys = cuda_quantize::padded_keys(Sk)
  int* nonfinite = nullptr;    // three flags, cleared by the caller
};

// Enqueues the one preparation launch on `stream` (asynchronous; launch errors throw fp4attn::Error("cuda")).
void prepare_e4m3_operands(const E4m3CallerInputs& in, const E4m3KernelOperands& out, cudaStream_t stream);

// Packed sequences (FlashAttention's varlen batches): in.q is (total_q, Hq, D)
// and in.k, in.v (total_k, Hkv, D), strides on S and H (stride_b unused);
// in.B sequences, sequence b's rows from cu_q[b] (cu_k[b]). The kernel reads
// Q's and K's codes in place (Fp8ForwardArgs::qk_in_place), so they are only
// scanned; the scales and Vᵀ take the tile-aligned layout
// (cuda/common/packed_rows.hpp), where no tile spans two sequences:
//   q_scale (Hq, q_rows / 128), k_scale (Hkv, k_rows / 128): each tile's
//   sequence's descale; v_scale (B, Hkv, D); vt (Hkv, D, k_rows).
// Every sequence's descales are checked, those of sequences without tokens too.
struct E4m3PackedLayout {
  const int* cu_q = nullptr;    // checked copies (cuda_common::check_packed_sequences), B + 1 each
  const int* cu_k = nullptr;
  const int* rows_q = nullptr;  // each sequence's first row in the layout; rows_q[B] the rows taken
  const int* rows_k = nullptr;
  std::int64_t q_rows = 0, k_rows = 0;  // the layout's rows, multiples of 128
};

void prepare_e4m3_packed_operands(const E4m3CallerInputs& in, const E4m3PackedLayout& packed,
                                  const E4m3KernelOperands& out, cudaStream_t stream);

}  // namespace fp4attn::sm90::fwd
