// Preparation of the FP8 backward: the log2-domain LSE per row, the NaN
// scales of non-finite input, and the one pass's dQ finalization. (The
// transposed code copies come from the quantizer and the MX fold.)
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "cuda/common/device_memory.hpp"
#include "cuda/sm90/bwd/bwd.hpp"
#include "fp4attn/direct_p.hpp"
#include "fp4attn/error.hpp"

namespace fp4attn::sm90::bwd {
namespace {

constexpr int kStatThreads = 128;

using cuda_common::check_cuda;

template <class T>
__device__ T from_float(float x);
template <>
__device__ float from_float<float>(float x) { return x; }
template <>
__device__ __half from_float<__half>(float x) { return __float2half_rn(x); }
template <>
__device__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

struct LseJob {
  const float* lse;
  const float* shift;
  float* delta;
  float* lse_log2;
  int B, Sq, Hq;
  std::int64_t padded, rows;
  const int* cu_seqlens_q;  // packed sequences: lse is (Hq, lse_pitch)
  std::int64_t lse_pitch;
  PackedRows packed;  // and the statistics the tile-aligned layout (padded = packed.q_rows)
};

// The packed sequence whose rows of the tile-aligned layout hold row r: the
// last b with first[b] ≤ r among the B + 1 first rows; B for a row past
// every sequence's tiles.
__device__ int sequence_of_row(const int* first, int B, std::int64_t r) {
  int lo = 0, hi = B;  // first[lo] ≤ r holds (first[0] = 0)
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (first[mid] <= r) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

// One thread per (b, h, padded row), or for packed sequences per (h, row of
// the layout). delta itself comes from the dO
// quantizer call (QRowDot); a NaN LSE (the forward saw non-finite input)
// overwrites it, so the row's dS, and with it dQ and dK, is NaN rather than
// silently zero.
__global__ void __launch_bounds__(kStatThreads) lse_rows_kernel(const LseJob job) {
  const std::int64_t index = static_cast<std::int64_t>(blockIdx.x) * kStatThreads + threadIdx.x;
  if (index >= job.rows) return;
  const std::int64_t r = index % job.padded, bh = index / job.padded;
  const bool packed = job.cu_seqlens_q != nullptr;
  // The row's sequence b and its place i in it.
  int b, h, i;
  if (packed) {
    b = sequence_of_row(job.packed.q, job.B, r), h = static_cast<int>(bh);
    i = b < job.B ? static_cast<int>(r - job.packed.q[b]) : 0;
  } else {
    b = static_cast<int>(bh / job.Hq), h = static_cast<int>(bh % job.Hq), i = static_cast<int>(r);
  }
  float lse_log2 = __int_as_float(0x7F800000);
  if (b < job.B && i < (packed ? job.cu_seqlens_q[b + 1] - job.cu_seqlens_q[b] : job.Sq)) {
    // The shift's layout: (B, Hq, Sq), or the packed (Hq, q_rows), as the quantizer wrote it.
    const std::int64_t row = packed ? index : bh * job.Sq + i;
    const float lse = job.lse[packed ? h * job.lse_pitch + job.cu_seqlens_q[b] + i : row];
    // The forward's LSE is that of the original scores; the recomputed scores
    // use the smoothed K, so its smooth_k shift comes back out.
    if (isfinite(lse)) lse_log2 = __fmul_rn(__fsub_rn(lse, job.shift != nullptr ? job.shift[row] : 0.0f), direct_p::kLog2e);
    if (isnan(lse)) job.delta[index] = lse, lse_log2 = 0.0f;
  }
  job.lse_log2[index] = lse_log2;
}

// Eight consecutive channels of dQ in the output's element type, stored as
// one 16-byte (f16, bf16) or two (f32) vector stores where `vector` says the
// output allows them, else one element at a time.
inline constexpr int kDqChannels = 8;

__device__ __forceinline__ unsigned short bits_of(__half x) { return __half_as_ushort(x); }
__device__ __forceinline__ unsigned short bits_of(__nv_bfloat16 x) { return __bfloat16_as_ushort(x); }

template <class T>
__device__ __forceinline__ void store_channels(T* out, const float (&x)[kDqChannels], bool vector) {
  if (vector) {
    if constexpr (sizeof(T) == 4) {
      reinterpret_cast<float4*>(out)[0] = make_float4(x[0], x[1], x[2], x[3]);
      reinterpret_cast<float4*>(out)[1] = make_float4(x[4], x[5], x[6], x[7]);
    } else {
      // Two elements a word, the lower channel in the low half (rounded as from_float rounds).
      const auto pair = [](float a, float b) {
        const T lo = from_float<T>(a), hi = from_float<T>(b);
        return static_cast<std::uint32_t>(bits_of(lo)) | static_cast<std::uint32_t>(bits_of(hi)) << 16;
      };
      *reinterpret_cast<uint4*>(out) = make_uint4(pair(x[0], x[1]), pair(x[2], x[3]), pair(x[4], x[5]), pair(x[6], x[7]));
    }
    return;
  }
#pragma unroll
  for (int e = 0; e < kDqChannels; ++e) out[e] = from_float<T>(x[e]);
}

// Thread i: channels 8j .. 8j + 7 of one dQ row, i = (row · Hq + h) · D / 8 + j
// in (B, Sq, Hq, D) order, read from the sums' layout (dq_accum_elems,
// dq_accum_column: the permutation moves aligned groups of 8 channels as a
// whole, so they are two 16-byte loads). Packed sequences: the rows are
// those of the tile-aligned layout instead, and rows that are no sequence's
// token (its tile's padding, past the last tile) are skipped. One thread per
// eight channels: a thread per element spent its time on 64-bit index
// divisions, at a third of the bandwidth (perf log v10).
template <class T>
__global__ void __launch_bounds__(kStatThreads) finalize_dq_kernel(const float* __restrict__ accum, TensorRef dq,
                                                                    float scale, int B, int Sq, std::int64_t padded,
                                                                    int Hq, int D, std::int64_t count, bool vector,
                                                                    const int* __restrict__ cu_seqlens_q,
                                                                    const int* __restrict__ first_rows) {
  const int groups = D / kDqChannels;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * kStatThreads + threadIdx.x; i < count;
       i += static_cast<std::int64_t>(gridDim.x) * kStatThreads) {
    const int d0 = static_cast<int>(i % groups) * kDqChannels;
    const std::int64_t row = i / groups;
    const int h = static_cast<int>(row % Hq);
    const std::int64_t bs = row / Hq;
    std::int64_t entry, sums;
    int s;
    if (cu_seqlens_q != nullptr) {
      const int b = sequence_of_row(first_rows, B, bs);  // bs: the layout's row
      s = b < B ? static_cast<int>(bs - first_rows[b]) : 0;
      if (b >= B || s >= cu_seqlens_q[b + 1] - cu_seqlens_q[b]) continue;
      entry = cu_seqlens_q[b] * dq.stride_s;
      sums = (static_cast<std::int64_t>(h) * padded + bs) * D;
    } else {
      const int b = static_cast<int>(bs / Sq);
      s = static_cast<int>(bs % Sq);
      entry = b * dq.stride_b;
      sums = ((static_cast<std::int64_t>(b) * Hq + h) * padded + s) * D;
    }
    // Rows start on multiples of 8 in both layouts, so s gives the row's permutation.
    const float4* from = reinterpret_cast<const float4*>(accum + sums + dq_accum_column(s, d0));
    const float4 lo = from[0], hi = from[1];
    const float x[kDqChannels] = {__fmul_rn(scale, lo.x), __fmul_rn(scale, lo.y), __fmul_rn(scale, lo.z),
                                  __fmul_rn(scale, lo.w), __fmul_rn(scale, hi.x), __fmul_rn(scale, hi.y),
                                  __fmul_rn(scale, hi.z), __fmul_rn(scale, hi.w)};
    store_channels(static_cast<T*>(dq.data) + entry + s * dq.stride_s + h * dq.stride_h + d0, x, vector);
  }
}

// Thread i of the grid: element i of each scale array, NaN when a flag is set.
__global__ void __launch_bounds__(kStatThreads) nan_scales_kernel(const int* __restrict__ flags, int flag_count,
                                                                   const int* __restrict__ more_flags, int more_count,
                                                                   ScaleArray a, ScaleArray b, ScaleArray c) {
  bool flagged = false;
  for (int f = 0; f < flag_count; ++f) flagged |= flags[f] != 0;
  for (int f = 0; f < more_count; ++f) flagged |= more_flags[f] != 0;
  const std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * kStatThreads + threadIdx.x;
  const auto take = [&](const ScaleArray& x) {
    if (i >= x.count) return;
    if (flagged) x.dst[i] = __int_as_float(0x7FC00000);
    else if (x.src != nullptr) x.dst[i] = x.src[i];
  };
  take(a), take(b), take(c);
}

}  // namespace

void nan_scales_if_flagged(const int* flags, int flag_count, const int* more_flags, int more_count, ScaleArray a,
                           ScaleArray b, ScaleArray c, cudaStream_t stream) {
  const std::int64_t most = std::max({a.count, b.count, c.count});
  if (most <= 0) return;
  if (more_flags == nullptr) more_count = 0;
  const unsigned grid = static_cast<unsigned>((most + kStatThreads - 1) / kStatThreads);
  nan_scales_kernel<<<grid, kStatThreads, 0, stream>>>(flags, flag_count, more_flags, more_count, a, b, c);
  check_cuda(cudaGetLastError(), "nan_scales_if_flagged launch");
}

void finalize_dq(const float* accum, ElementType type, const TensorRef& dq, float scale, int B, int Sq, int Hq, int D,
                 const int* cu_seqlens_q, const PackedRows& rows, cudaStream_t stream) {
  if (D % kDqChannels != 0) throw Error("D", "finalize_dq takes whole groups of 8 channels");
  const bool packed = cu_seqlens_q != nullptr;
  const std::int64_t count = (packed ? rows.q_rows : static_cast<std::int64_t>(B) * Sq) * Hq * (D / kDqChannels);
  const std::int64_t padded = packed ? rows.q_rows : padded_tokens(Sq);
  // Vector stores where every group of 8 channels starts on a 16-byte boundary.
  const std::int64_t element = type == ElementType::f32 ? 4 : 2;
  const std::uintptr_t bits = reinterpret_cast<std::uintptr_t>(dq.data) |
                              static_cast<std::uintptr_t>((dq.stride_b | dq.stride_s | dq.stride_h) * element);
  const bool vector = bits % 16 == 0;
  constexpr std::int64_t kMaxBlocks = 1 << 16;
  const unsigned grid = static_cast<unsigned>(std::min(kMaxBlocks, (count + kStatThreads - 1) / kStatThreads));
  switch (type) {
    case ElementType::f32:
      finalize_dq_kernel<float>
          <<<grid, kStatThreads, 0, stream>>>(accum, dq, scale, B, Sq, padded, Hq, D, count, vector, cu_seqlens_q,
                                               rows.q);
      break;
    case ElementType::f16:
      finalize_dq_kernel<__half>
          <<<grid, kStatThreads, 0, stream>>>(accum, dq, scale, B, Sq, padded, Hq, D, count, vector, cu_seqlens_q,
                                               rows.q);
      break;
    case ElementType::bf16:
      finalize_dq_kernel<__nv_bfloat16>
          <<<grid, kStatThreads, 0, stream>>>(accum, dq, scale, B, Sq, padded, Hq, D, count, vector, cu_seqlens_q,
                                               rows.q);
      break;
  }
  check_cuda(cudaGetLastError(), "finalize_dq launch");
}

void lse_statistics(const float* lse, const float* shift, float* delta, float* lse_log2, int B, int Sq, int Hq,
                    const int* cu_seqlens_q, std::int64_t lse_pitch, const PackedRows& rows, cudaStream_t stream) {
  const bool packed = cu_seqlens_q != nullptr;
  const std::int64_t padded = packed ? rows.q_rows : padded_tokens(Sq);
  const LseJob job{lse, shift, delta, lse_log2, B, Sq, Hq, padded, (packed ? 1 : B) * Hq * padded, cu_seqlens_q,
                   lse_pitch, rows};
  const unsigned grid = static_cast<unsigned>((job.rows + kStatThreads - 1) / kStatThreads);
  lse_rows_kernel<<<grid, kStatThreads, 0, stream>>>(job);
  check_cuda(cudaGetLastError(), "lse_statistics launch");
}

}  // namespace fp4attn::sm90::bwd
