// Preparation of the FP8 backward: the transposed code copies that the
// K-major-only FP8 wgmma needs as B operands of the gradient products (for
// recipe mxfp4_train's folded codes; the FP8 quantizer writes the others),
// and the log2-domain LSE per row.
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

constexpr int kTransposeThreads = 128;
constexpr int kStatThreads = 128;
constexpr int kChunk = 16;      // bytes per vector load of a token row

using cuda_common::check_cuda;

// One CTA moves 128 tokens of one (b, h): token rows into shared memory
// (coalesced 16-byte loads, all of a thread's in flight at once), then D
// transposed rows of 128 tokens out, each 32-token group in the A-operand
// order (slot k holds token vt_key_of_slot(k)). A thread takes four channels
// of one 32-token group: per four slots it reads the four tokens' words of
// those channels and transposes the 4 × 4 bytes by byte permutes, then it
// stores 32 bytes (a whole sector) per channel. At D = 128 a warp reads one
// token row per instruction, free of bank conflicts.
template <int D>
__global__ void __launch_bounds__(kTransposeThreads) transpose_kernel(const std::uint8_t* __restrict__ codes,
                                                                      std::uint8_t* __restrict__ out, int S, int H,
                                                                      std::int64_t padded) {
  __shared__ alignas(16) std::uint8_t tile[kTile * D];
  const int s0 = blockIdx.x * kTile, h = blockIdx.y, b = blockIdx.z;
  constexpr int kChunksPerRow = D / kChunk;
  constexpr int kLoads = kTile * kChunksPerRow / kTransposeThreads;
  static_assert(kLoads * kTransposeThreads == kTile * kChunksPerRow, "whole loads per thread");
  uint4 v[kLoads];
#pragma unroll
  for (int j = 0; j < kLoads; ++j) {
    const int i = threadIdx.x + j * kTransposeThreads;
    const int token = i / kChunksPerRow, chunk = i % kChunksPerRow;
    v[j] = make_uint4(0, 0, 0, 0);
    if (s0 + token < S)
      v[j] = *reinterpret_cast<const uint4*>(codes + ((static_cast<std::int64_t>(b) * S + s0 + token) * H + h) * D +
                                             chunk * kChunk);
  }
#pragma unroll
  for (int j = 0; j < kLoads; ++j) {
    const int i = threadIdx.x + j * kTransposeThreads;
    *reinterpret_cast<uint4*>(tile + (i / kChunksPerRow) * D + (i % kChunksPerRow) * kChunk) = v[j];
  }
  __syncthreads();
  constexpr int kGroup = cuda_quantize::kVtKeyGroup;
  constexpr int kQuads = D / 4;  // four channels per thread
  static_assert(kQuads * (kTile / kGroup) <= kTransposeThreads, "one (channel quad, group) per thread");
  if (threadIdx.x >= kQuads * (kTile / kGroup)) return;
  const int quad = threadIdx.x % kQuads, group = threadIdx.x / kQuads;
  const std::uint8_t* column = tile + group * kGroup * D + 4 * quad;
  std::uint32_t rows[4][kGroup / 4];  // channel 4·quad + c, slots 4m .. 4m + 3 in word m
#pragma unroll
  for (int m = 0; m < kGroup / 4; ++m) {
    std::uint32_t w[4];  // token of slot 4m + i: its four channels
#pragma unroll
    for (int i = 0; i < 4; ++i)
      w[i] = *reinterpret_cast<const std::uint32_t*>(column + cuda_quantize::vt_key_of_slot(4 * m + i) * D);
    const std::uint32_t lo01 = __byte_perm(w[0], w[1], 0x5140), hi01 = __byte_perm(w[0], w[1], 0x7362);
    const std::uint32_t lo23 = __byte_perm(w[2], w[3], 0x5140), hi23 = __byte_perm(w[2], w[3], 0x7362);
    rows[0][m] = __byte_perm(lo01, lo23, 0x5410);
    rows[1][m] = __byte_perm(lo01, lo23, 0x7632);
    rows[2][m] = __byte_perm(hi01, hi23, 0x5410);
    rows[3][m] = __byte_perm(hi01, hi23, 0x7632);
  }
  std::uint8_t* dst = out + ((static_cast<std::int64_t>(b) * H + h) * D + 4 * quad) * padded + s0 + group * kGroup;
#pragma unroll
  for (int c = 0; c < 4; ++c) {
    auto* row = reinterpret_cast<uint4*>(dst + c * padded);
    row[0] = make_uint4(rows[c][0], rows[c][1], rows[c][2], rows[c][3]);
    row[1] = make_uint4(rows[c][4], rows[c][5], rows[c][6], rows[c][7]);
  }
}

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
  int Sq;
  std::int64_t padded, rows;
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
  float lse_log2 = __int_as_float(0x7F800000);
  if (i < job.Sq) {
    const std::int64_t row = bh * job.Sq + i;
    const float lse = job.lse[row];
    // The forward's LSE is that of the original scores; the recomputed scores
    // use the smoothed K, so its smooth_k shift comes back out.
    if (isfinite(lse)) lse_log2 = __fmul_rn(__fsub_rn(lse, job.shift != nullptr ? job.shift[row] : 0.0f), direct_p::kLog2e);
    if (isnan(lse)) job.delta[index] = lse, lse_log2 = 0.0f;
  }
  job.lse_log2[index] = lse_log2;
}

template <class T>
__global__ void __launch_bounds__(kStatThreads) finalize_dq_kernel(const float* __restrict__ accum, TensorRef dq,
                                                                    float scale, int Sq, int Hq, int D,
                                                                    std::int64_t count) {
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * kStatThreads + threadIdx.x; i < count;
       i += static_cast<std::int64_t>(gridDim.x) * kStatThreads) {
    const int d = static_cast<int>(i % D);
    const std::int64_t row = i / D;
    const int h = static_cast<int>(row % Hq);
    const std::int64_t bs = row / Hq;
    const int s = static_cast<int>(bs % Sq), b = static_cast<int>(bs / Sq);
    T* out = static_cast<T*>(dq.data) + b * dq.stride_b + s * dq.stride_s + h * dq.stride_h + d;
    *out = from_float<T>(__fmul_rn(scale, accum[i]));
  }
}

// Thread i of the grid: element i of each scale array, NaN when a flag is set.
__global__ void __launch_bounds__(kStatThreads) nan_scales_kernel(const int* __restrict__ flags, int flag_count,
                                                                   float* a, int a_count, float* b, int b_count,
                                                                   float* c, int c_count) {
  bool flagged = false;
  for (int f = 0; f < flag_count; ++f) flagged |= flags[f] != 0;
  if (!flagged) return;
  const int i = blockIdx.x * kStatThreads + threadIdx.x;
  if (i < a_count) a[i] = __int_as_float(0x7FC00000);
  if (i < b_count) b[i] = __int_as_float(0x7FC00000);
  if (i < c_count) c[i] = __int_as_float(0x7FC00000);
}

}  // namespace

void nan_scales_if_flagged(const int* flags, int flag_count, float* a, std::int64_t a_count, float* b,
                           std::int64_t b_count, float* c, std::int64_t c_count, cudaStream_t stream) {
  const std::int64_t most = std::max({a_count, b_count, c_count});
  if (most <= 0) return;
  if (most > std::int64_t{1} << 30) throw Error("shape", "too many scale blocks");
  const unsigned grid = static_cast<unsigned>((most + kStatThreads - 1) / kStatThreads);
  nan_scales_kernel<<<grid, kStatThreads, 0, stream>>>(flags, flag_count, a, static_cast<int>(a_count), b,
                                                       static_cast<int>(b_count), c, static_cast<int>(c_count));
  check_cuda(cudaGetLastError(), "nan_scales_if_flagged launch");
}

void finalize_dq(const float* accum, ElementType type, const TensorRef& dq, float scale, int B, int Sq, int Hq, int D,
                 cudaStream_t stream) {
  const std::int64_t count = static_cast<std::int64_t>(B) * Sq * Hq * D;
  constexpr std::int64_t kMaxBlocks = 1 << 16;
  const unsigned grid = static_cast<unsigned>(std::min(kMaxBlocks, (count + kStatThreads - 1) / kStatThreads));
  switch (type) {
    case ElementType::f32:
      finalize_dq_kernel<float><<<grid, kStatThreads, 0, stream>>>(accum, dq, scale, Sq, Hq, D, count);
      break;
    case ElementType::f16:
      finalize_dq_kernel<__half><<<grid, kStatThreads, 0, stream>>>(accum, dq, scale, Sq, Hq, D, count);
      break;
    case ElementType::bf16:
      finalize_dq_kernel<__nv_bfloat16><<<grid, kStatThreads, 0, stream>>>(accum, dq, scale, Sq, Hq, D, count);
      break;
  }
  check_cuda(cudaGetLastError(), "finalize_dq launch");
}

void transpose_codes(const std::uint8_t* codes, std::uint8_t* out, int B, int S, int H, int D, cudaStream_t stream) {
  const std::int64_t padded = padded_tokens(S);
  const dim3 grid(static_cast<unsigned>(padded / kTile), H, B);
  switch (D) {
    case 64: transpose_kernel<64><<<grid, kTransposeThreads, 0, stream>>>(codes, out, S, H, padded); break;
    case 128: transpose_kernel<128><<<grid, kTransposeThreads, 0, stream>>>(codes, out, S, H, padded); break;
    default: throw Error("D", "the sm90 backward supports D = 64 and 128, got " + std::to_string(D));
  }
  check_cuda(cudaGetLastError(), "transpose_codes launch");
}

void lse_statistics(const float* lse, const float* shift, float* delta, float* lse_log2, int B, int Sq, int Hq,
                    cudaStream_t stream) {
  const std::int64_t padded = padded_tokens(Sq);
  const LseJob job{lse, shift, delta, lse_log2, Sq, padded, static_cast<std::int64_t>(B) * Hq * padded};
  const unsigned grid = static_cast<unsigned>((job.rows + kStatThreads - 1) / kStatThreads);
  lse_rows_kernel<<<grid, kStatThreads, 0, stream>>>(job);
  check_cuda(cudaGetLastError(), "lse_statistics launch");
}

}  // namespace fp4attn::sm90::bwd
