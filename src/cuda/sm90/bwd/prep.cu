// Preparation of the FP8 backward: the transposed code copies that the
// K-major-only FP8 wgmma needs as B operands of the gradient products, and
// the per-row statistics (delta, log2-domain LSE).
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
constexpr int kStatLanes = 16;  // lanes per row of the statistics
constexpr int kChunk = 16;      // bytes per vector load of a token row
constexpr int kWordTokens = 4;  // tokens per 32-bit store of a transposed row

using cuda_common::check_cuda;

// One CTA moves 128 tokens of one (b, h): token rows into shared memory
// (coalesced 16-byte loads), then D transposed rows of 128 tokens out, each
// 32-token group in the A-operand order (slot k holds token vt_key_of_slot(k)).
// A thread writes 16 slots of one row; neighbouring lanes take neighbouring
// rows, so their shared-memory reads (one byte column of 16 tokens) fall into
// a few words and never conflict.
template <int D>
__global__ void __launch_bounds__(kTransposeThreads) transpose_kernel(const std::uint8_t* __restrict__ codes,
                                                                      std::uint8_t* __restrict__ out, int S, int H,
                                                                      std::int64_t padded) {
  __shared__ alignas(16) std::uint8_t tile[kTile * D];
  const int s0 = blockIdx.x * kTile, h = blockIdx.y, b = blockIdx.z;
  constexpr int kChunksPerRow = D / kChunk;
  for (int i = threadIdx.x; i < kTile * kChunksPerRow; i += kTransposeThreads) {
    const int token = i / kChunksPerRow, chunk = i % kChunksPerRow;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (s0 + token < S)
      v = *reinterpret_cast<const uint4*>(codes + ((static_cast<std::int64_t>(b) * S + s0 + token) * H + h) * D +
                                          chunk * kChunk);
    *reinterpret_cast<uint4*>(tile + token * D + chunk * kChunk) = v;
  }
  __syncthreads();
  constexpr int kSlotChunks = kTile / kChunk;  // 16-slot pieces of a transposed row
  std::uint8_t* dst = out + (static_cast<std::int64_t>(b) * H + h) * D * padded + s0;
  for (int w = threadIdx.x; w < D * kSlotChunks; w += kTransposeThreads) {
    const int d = w % D, piece = w / D;
    std::uint32_t words[kChunk / kWordTokens];
#pragma unroll
    for (int k = 0; k < kChunk / kWordTokens; ++k) {
      std::uint32_t packed = 0;
#pragma unroll
      for (int i = 0; i < kWordTokens; ++i) {
        const int slot = piece * kChunk + k * kWordTokens + i;
        const int group = slot / cuda_quantize::kVtKeyGroup, in_group = slot % cuda_quantize::kVtKeyGroup;
        const int token = group * cuda_quantize::kVtKeyGroup + cuda_quantize::vt_key_of_slot(in_group);
        packed |= static_cast<std::uint32_t>(tile[token * D + d]) << (8 * i);
      }
      words[k] = packed;
    }
    *reinterpret_cast<uint4*>(dst + static_cast<std::int64_t>(d) * padded + piece * kChunk) =
        make_uint4(words[0], words[1], words[2], words[3]);
  }
}

template <class T>
__device__ float to_float(T x);
template <>
__device__ float to_float<float>(float x) { return x; }
template <>
__device__ float to_float<__half>(__half x) { return __half2float(x); }
template <>
__device__ float to_float<__nv_bfloat16>(__nv_bfloat16 x) { return __bfloat162float(x); }

template <class T>
__device__ T from_float(float x);
template <>
__device__ float from_float<float>(float x) { return x; }
template <>
__device__ __half from_float<__half>(float x) { return __float2half_rn(x); }
template <>
__device__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

struct StatJob {
  TensorRef d_o, o;
  const float* lse;
  const float* shift;
  float* delta;
  float* lse_log2;
  int B, Sq, Hq, D;
  std::int64_t padded;
};

// kStatLanes lanes per (b, h, padded row): coalesced reads of dO and O, a
// shuffle sum (its order differs from the emulator's ascending sum by fp32
// rounding only, far below what dP's tensor-core sum already moves dS).
template <class T>
__global__ void __launch_bounds__(kStatThreads) row_stat_kernel(const StatJob job) {
  const std::int64_t index = (static_cast<std::int64_t>(blockIdx.x) * kStatThreads + threadIdx.x) / kStatLanes;
  const int lane = threadIdx.x % kStatLanes;
  const std::int64_t rows = static_cast<std::int64_t>(job.B) * job.Hq * job.padded;
  if (index >= rows) return;  // whole groups of lanes leave together (rows·kStatLanes is a multiple of 32)
  const int i = static_cast<int>(index % job.padded);
  const std::int64_t bh = index / job.padded;
  const int h = static_cast<int>(bh % job.Hq), b = static_cast<int>(bh / job.Hq);
  float delta = 0.0f;
  if (i < job.Sq) {
    const T* d_o = static_cast<const T*>(job.d_o.data) + b * job.d_o.stride_b + i * job.d_o.stride_s + h * job.d_o.stride_h;
    const T* o = static_cast<const T*>(job.o.data) + b * job.o.stride_b + i * job.o.stride_s + h * job.o.stride_h;
    for (int d = lane; d < job.D; d += kStatLanes) delta = fmaf(to_float(d_o[d]), to_float(o[d]), delta);
  }
#pragma unroll
  for (int o = kStatLanes / 2; o > 0; o >>= 1) delta += __shfl_xor_sync(0xFFFFFFFFu, delta, o, kStatLanes);
  if (lane != 0) return;
  float lse_log2 = __int_as_float(0x7F800000);
  if (i < job.Sq) {
    const std::int64_t row = bh * job.Sq + i;
    const float lse = job.lse[row];
    // The forward's LSE is that of the original scores; the recomputed scores
    // use the smoothed K, so its smooth_k shift comes back out.
    if (isfinite(lse)) lse_log2 = __fmul_rn(__fsub_rn(lse, job.shift != nullptr ? job.shift[row] : 0.0f), direct_p::kLog2e);
    // A NaN LSE (the forward saw non-finite input) makes the row's dS, and
    // so dQ and dK, NaN rather than silently zero.
    if (isnan(lse)) delta = lse, lse_log2 = 0.0f;
  } else {
    delta = 0.0f;
  }
  job.delta[index] = delta;
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

void row_statistics(ElementType type, const TensorRef& d_o, const TensorRef& o, const float* lse, const float* shift,
                    float* delta, float* lse_log2, int B, int Sq, int Hq, int D, cudaStream_t stream) {
  const StatJob job{d_o, o, lse, shift, delta, lse_log2, B, Sq, Hq, D, padded_tokens(Sq)};
  const std::int64_t threads = static_cast<std::int64_t>(B) * Hq * job.padded * kStatLanes;
  const unsigned grid = static_cast<unsigned>((threads + kStatThreads - 1) / kStatThreads);
  switch (type) {
    case ElementType::f32: row_stat_kernel<float><<<grid, kStatThreads, 0, stream>>>(job); break;
    case ElementType::f16: row_stat_kernel<__half><<<grid, kStatThreads, 0, stream>>>(job); break;
    case ElementType::bf16: row_stat_kernel<__nv_bfloat16><<<grid, kStatThreads, 0, stream>>>(job); break;
  }
  check_cuda(cudaGetLastError(), "row_statistics launch");
}

}  // namespace fp4attn::sm90::bwd
