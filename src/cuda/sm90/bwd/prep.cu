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
  int Sq, Hq;
  std::int64_t padded, rows;
  const int* cu_seqlens_q;  // packed sequences: lse is (Hq, lse_pitch)
  std::int64_t lse_pitch;
};

// One thread per (b, h, padded row). delta itself comes from the dO
// quantizer call (QRowDot); a NaN LSE (the forward saw non-finite input)
// overwrites it, so the row's dS, and with it dQ and dK, is NaN rather than
// silently zero.
__global__ void __launch_bounds__(kStatThreads) lse_rows_kernel(const LseJob job) {
  const std::int64_t index = static_cast<std::int64_t>(blockIdx.x) * kStatThreads + threadIdx.x;
  if (index >= job.rows) return;
  const int i = static_cast<int>(index % job.padded);
  const std::int64_t bh = index / job.padded;
  const int b = static_cast<int>(bh / job.Hq), h = static_cast<int>(bh % job.Hq);
  const bool packed = job.cu_seqlens_q != nullptr;
  float lse_log2 = __int_as_float(0x7F800000);
  if (i < (packed ? job.cu_seqlens_q[b + 1] - job.cu_seqlens_q[b] : job.Sq)) {
    const std::int64_t row = bh * job.Sq + i;  // the shift's (B, Hq, Sq) layout
    const float lse = job.lse[packed ? h * job.lse_pitch + job.cu_seqlens_q[b] + i : row];
    // The forward's LSE is that of the original scores; the recomputed scores
    // use the smoothed K, so its smooth_k shift comes back out.
    if (isfinite(lse)) lse_log2 = __fmul_rn(__fsub_rn(lse, job.shift != nullptr ? job.shift[row] : 0.0f), direct_p::kLog2e);
    if (isnan(lse)) job.delta[index] = lse, lse_log2 = 0.0f;
  }
  job.lse_log2[index] = lse_log2;
}

// Thread i: element i of dQ in (B, Sq, Hq, D) order, read from its place in
// the sums' layout (dq_accum_elems, dq_accum_column); for packed sequences
// rows past the entry's length are skipped.
template <class T>
__global__ void __launch_bounds__(kStatThreads) finalize_dq_kernel(const float* __restrict__ accum, TensorRef dq,
                                                                    float scale, int Sq, std::int64_t padded,
                                                                    int Hq, int D, std::int64_t count,
                                                                    const int* __restrict__ cu_seqlens_q) {
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * kStatThreads + threadIdx.x; i < count;
       i += static_cast<std::int64_t>(gridDim.x) * kStatThreads) {
    const int d = static_cast<int>(i % D);
    const std::int64_t row = i / D;
    const int h = static_cast<int>(row % Hq);
    const std::int64_t bs = row / Hq;
    const int s = static_cast<int>(bs % Sq), b = static_cast<int>(bs / Sq);
    if (cu_seqlens_q != nullptr && s >= cu_seqlens_q[b + 1] - cu_seqlens_q[b]) continue;
    const std::int64_t entry = cu_seqlens_q != nullptr ? cu_seqlens_q[b] * dq.stride_s : b * dq.stride_b;
    T* out = static_cast<T*>(dq.data) + entry + s * dq.stride_s + h * dq.stride_h + d;
    const float sum = accum[((static_cast<std::int64_t>(b) * Hq + h) * padded + s) * D + dq_accum_column(s, d)];
    *out = from_float<T>(__fmul_rn(scale, sum));
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
                 const int* cu_seqlens_q, cudaStream_t stream) {
  const std::int64_t count = static_cast<std::int64_t>(B) * Sq * Hq * D, padded = padded_tokens(Sq);
  constexpr std::int64_t kMaxBlocks = 1 << 16;
  const unsigned grid = static_cast<unsigned>(std::min(kMaxBlocks, (count + kStatThreads - 1) / kStatThreads));
  switch (type) {
    case ElementType::f32:
      finalize_dq_kernel<float>
          <<<grid, kStatThreads, 0, stream>>>(accum, dq, scale, Sq, padded, Hq, D, count, cu_seqlens_q);
      break;
    case ElementType::f16:
      finalize_dq_kernel<__half>
          <<<grid, kStatThreads, 0, stream>>>(accum, dq, scale, Sq, padded, Hq, D, count, cu_seqlens_q);
      break;
    case ElementType::bf16:
      finalize_dq_kernel<__nv_bfloat16>
          <<<grid, kStatThreads, 0, stream>>>(accum, dq, scale, Sq, padded, Hq, D, count, cu_seqlens_q);
      break;
  }
  check_cuda(cudaGetLastError(), "finalize_dq launch");
}

void lse_statistics(const float* lse, const float* shift, float* delta, float* lse_log2, int B, int Sq, int Hq,
                    const int* cu_seqlens_q, std::int64_t lse_pitch, cudaStream_t stream) {
  const std::int64_t padded = padded_tokens(Sq);
  const LseJob job{lse, shift, delta, lse_log2, Sq, Hq, padded, static_cast<std::int64_t>(B) * Hq * padded,
                   cu_seqlens_q, lse_pitch};
  const unsigned grid = static_cast<unsigned>((job.rows + kStatThreads - 1) / kStatThreads);
  lse_rows_kernel<<<grid, kStatThreads, 0, stream>>>(job);
  check_cuda(cudaGetLastError(), "lse_statistics launch");
}

}  // namespace fp4attn::sm90::bwd
