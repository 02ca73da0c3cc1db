// GPU quantizer for recipe fp8. Every arithmetic step mirrors the CPU
// quantizer so the codes agree bit for bit: amax of |x| (order-free), scale =
// amax / 448 in fp32 (1 when zero), code = RNE-satfinite E4M3 of x / scale
// (IEEE division; the hardware F2FP conversion equals the host rounding rule),
// and for smooth_k a double sum over ascending s and an fp32 subtraction.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <string>

#include "cuda/quantize/quantize_fp8.hpp"
#include "fp4attn/error.hpp"
#include "fp4attn/formats.hpp"

namespace fp4attn::cuda_quantize {
namespace {

constexpr int kThreads = 256;
constexpr int kMeanThreads = 128;
constexpr int kAmaxTokensPerBlock = 64;  // V amax: tokens per CTA along s
constexpr int kRowsPerShiftBlock = 8;    // lse_shift: one warp per query row
constexpr std::uint32_t kFullWarp = 0xFFFFFFFFu;
enum NonfiniteSlot : int { kQ = 0, kK = 1, kV = 2 };

void check_cuda(cudaError_t err, const char* what) {
  if (err != cudaSuccess) throw Error("cuda", std::string(what) + ": " + cudaGetErrorString(err));
}

__device__ __forceinline__ float load(const float* p) { return *p; }
__device__ __forceinline__ float load(const __half* p) { return __half2float(*p); }
__device__ __forceinline__ float load(const __nv_bfloat16* p) { return __bfloat162float(*p); }

template <class T>
struct Input {
  const T* data;
  std::int64_t stride_b, stride_s, stride_h;
  __device__ float at(std::int64_t b, std::int64_t s, std::int64_t h, std::int64_t d) const {
    return load(data + b * stride_b + s * stride_s + h * stride_h + d);
  }
};

template <class T>
Input<T> typed(const StridedInput& x) {
  return {static_cast<const T*>(x.data), x.stride_b, x.stride_s, x.stride_h};
}

__device__ __forceinline__ float fp8_scale_of(float amax) {
  const float scale = amax / kE4M3Max;  // same rule as fp4attn::fp8_block_scale
  return scale > 0.0f ? scale : 1.0f;
}

__device__ __forceinline__ std::uint8_t e4m3(float x) {
  return static_cast<std::uint8_t>(__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3));
}

// One thread per (b, h, d): the mean over s, summed in double in ascending s
// exactly as the CPU does; a parallel reduction would round differently.
template <class T>
__global__ void sequence_mean_kernel(Input<T> k, int B, int S, int H, int D, float* mean) {
  const std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= static_cast<std::int64_t>(B) * H * D) return;
  const int d = i % D, h = (i / D) % H, b = i / (static_cast<std::int64_t>(D) * H);
  double sum = 0.0;
  for (int s = 0; s < S; ++s) sum += k.at(b, s, h, d);
  mean[i] = static_cast<float>(sum / static_cast<double>(S));
}

__device__ float block_max(float v, float* scratch) {
  for (int off = 16; off > 0; off /= 2) v = fmaxf(v, __shfl_xor_sync(kFullWarp, v, off));
  if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = v;
  __syncthreads();
  float m = 0.0f;
  for (int w = 0; w < kThreads / 32; ++w) m = fmaxf(m, scratch[w]);
  return m;
}

// Q or K: one CTA per (token block, h, b). Pass 1 finds the block amax of
// x (− mean), pass 2 writes the codes; the second read hits L2.
template <class T>
__global__ void __launch_bounds__(kThreads) quantize_tokens_kernel(Input<T> x, int S, int H, int D, const float* mean,
                                                                   std::uint8_t* codes, float* scales, int* nonfinite) {
  __shared__ float scratch[kThreads / 32];
  const int blk = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const int s0 = blk * kTokenBlock;
  const int tokens = min(kTokenBlock, S - s0);
  const float* m = mean != nullptr ? mean + (static_cast<std::int64_t>(b) * H + h) * D : nullptr;
  const int count = tokens * D;
  float amax = 0.0f;
  bool bad = false;
  for (int i = threadIdx.x; i < count; i += kThreads) {
    const int s = s0 + i / D, d = i % D;
    float v = x.at(b, s, h, d);
    bad |= !isfinite(v);
    if (m != nullptr) v = v - m[d];
    amax = fmaxf(amax, fabsf(v));
  }
  if (bad) *nonfinite = 1;
  const float scale = fp8_scale_of(block_max(amax, scratch));
  if (threadIdx.x == 0) scales[(static_cast<std::int64_t>(b) * H + h) * gridDim.x + blk] = scale;
  for (int i = threadIdx.x; i < count; i += kThreads) {
    const int s = s0 + i / D, d = i % D;
    float v = x.at(b, s, h, d);
    if (m != nullptr) v = v - m[d];
    codes[((static_cast<std::int64_t>(b) * S + s) * H + h) * D + d] = e4m3(v / scale);
  }
}

// V amax per (b, h, d) over the whole sequence: CTAs over token chunks,
// combined with an integer atomicMax (non-negative floats order as their bits).
template <class T>
__global__ void channel_amax_kernel(Input<T> v, int S, int H, int D, unsigned* amax_bits, int* nonfinite) {
  const int h = blockIdx.y, b = blockIdx.z;
  const int s0 = blockIdx.x * kAmaxTokensPerBlock, s1 = min(S, s0 + kAmaxTokensPerBlock);
  for (int d = threadIdx.x; d < D; d += blockDim.x) {
    float amax = 0.0f;
    bool bad = false;
    for (int s = s0; s < s1; ++s) {
      const float x = v.at(b, s, h, d);
      bad |= !isfinite(x);
      amax = fmaxf(amax, fabsf(x));
    }
    if (bad) *nonfinite = 1;
    atomicMax(amax_bits + (static_cast<std::int64_t>(b) * H + h) * D + d, __float_as_uint(amax));
  }
}

__global__ void amax_to_scale_kernel(float* scale_inout, std::int64_t n) {
  const std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) scale_inout[i] = fp8_scale_of(scale_inout[i]);
}

// Slot of key k (0..31) inside its Vᵀ group: the inverse of vt_key_of_slot.
__device__ __forceinline__ int vt_slot_of_key(int k) {
  const int h = k / 16, r = k % 16;
  return 16 * h + 4 * ((r % 8) / 2) + (r % 2) + 2 * (r / 8);
}

// Vᵀ: one CTA per (128-key tile, h, b). Codes are staged in shared memory as
// [d][slot] so both the read of V (along d) and the write of Vᵀ (along keys)
// are contiguous.
template <class T, int kMaxD>
__global__ void __launch_bounds__(kThreads) transpose_v_kernel(Input<T> v, int S, int H, int D, const float* scales,
                                                               std::uint8_t* vt, std::int64_t vt_keys) {
  __shared__ std::uint8_t tile[kMaxD][kTokenBlock];
  const int k0 = blockIdx.x * kTokenBlock, h = blockIdx.y, b = blockIdx.z;
  const float* scale = scales + (static_cast<std::int64_t>(b) * H + h) * D;
  for (int i = threadIdx.x; i < kTokenBlock * D; i += kThreads) {
    const int kl = i / D, d = i % D, key = k0 + kl;
    const std::uint8_t code = key < S ? e4m3(v.at(b, key, h, d) / scale[d]) : 0;
    tile[d][(kl / kVtKeyGroup) * kVtKeyGroup + vt_slot_of_key(kl % kVtKeyGroup)] = code;
  }
  __syncthreads();
  constexpr int kVec = 16;  // bytes per store
  std::uint8_t* out = vt + (static_cast<std::int64_t>(b) * H + h) * D * vt_keys + k0;
  for (int i = threadIdx.x; i < D * (kTokenBlock / kVec); i += kThreads) {
    const int d = i / (kTokenBlock / kVec), c = i % (kTokenBlock / kVec);
    *reinterpret_cast<uint4*>(out + d * vt_keys + c * kVec) = *reinterpret_cast<const uint4*>(&tile[d][c * kVec]);
  }
}

// lse_shift[b, h, s] = softmax_scale · Σ_d q_deq[d] · k_mean[d], one warp per row.
__global__ void lse_shift_kernel(const std::uint8_t* q, const float* q_scale, const float* k_mean, int B, int S, int Hq,
                                 int Hkv, int D, float softmax_scale, float* shift) {
  const std::int64_t row = static_cast<std::int64_t>(blockIdx.x) * kRowsPerShiftBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= static_cast<std::int64_t>(B) * Hq * S) return;
  const int s = row % S, h = (row / S) % Hq, b = row / (static_cast<std::int64_t>(S) * Hq);
  const float sq = q_scale[(static_cast<std::int64_t>(b) * Hq + h) * ((S + kTokenBlock - 1) / kTokenBlock) +
                           s / kTokenBlock];
  const float* mean = k_mean + (static_cast<std::int64_t>(b) * Hkv + h / (Hq / Hkv)) * D;
  const std::uint8_t* qrow = q + ((static_cast<std::int64_t>(b) * S + s) * Hq + h) * D;
  float acc = 0.0f;
  for (int d = lane; d < D; d += 32) acc = fmaf(decode(ElemFormat::e4m3, qrow[d]) * sq, mean[d], acc);
  for (int off = 16; off > 0; off /= 2) acc += __shfl_xor_sync(kFullWarp, acc, off);
  if (lane == 0) shift[row] = softmax_scale * acc;
}

unsigned blocks_for(std::int64_t n, int threads) { return static_cast<unsigned>((n + threads - 1) / threads); }

template <class TQ, class TK, class TV>
void run(const StridedInput& q, const StridedInput& k, const StridedInput& v, bool smooth_k, float softmax_scale,
         const Fp8Buffers& out, cudaStream_t stream) {
  const int B = static_cast<int>(q.B), Sq = static_cast<int>(q.S), Sk = static_cast<int>(k.S);
  const int Hq = static_cast<int>(q.H), Hkv = static_cast<int>(k.H), D = static_cast<int>(q.D);
  const unsigned q_blocks = blocks_for(Sq, kTokenBlock), k_blocks = blocks_for(Sk, kTokenBlock);

  quantize_tokens_kernel<<<dim3(q_blocks, Hq, B), kThreads, 0, stream>>>(typed<TQ>(q), Sq, Hq, D, nullptr, out.q,
                                                                         out.q_scale, out.nonfinite + kQ);
  if (smooth_k) {
    sequence_mean_kernel<<<blocks_for(k.B * k.H * k.D, kMeanThreads), kMeanThreads, 0, stream>>>(typed<TK>(k), B, Sk,
                                                                                                  Hkv, D, out.k_mean);
    lse_shift_kernel<<<blocks_for(q.B * q.H * q.S, kRowsPerShiftBlock), kRowsPerShiftBlock * 32, 0, stream>>>(
        out.q, out.q_scale, out.k_mean, B, Sq, Hq, Hkv, D, softmax_scale, out.lse_shift);
  }
  quantize_tokens_kernel<<<dim3(k_blocks, Hkv, B), kThreads, 0, stream>>>(
      typed<TK>(k), Sk, Hkv, D, smooth_k ? out.k_mean : nullptr, out.k, out.k_scale, out.nonfinite + kK);

  // V: amax into v_scale's storage as float bits, then amax → scale in place.
  const std::int64_t channels = v.B * v.H * v.D;
  check_cuda(cudaMemsetAsync(out.v_scale, 0, channels * sizeof(float), stream), "cudaMemsetAsync");
  channel_amax_kernel<<<dim3(blocks_for(Sk, kAmaxTokensPerBlock), Hkv, B), D, 0, stream>>>(
      typed<TV>(v), Sk, Hkv, D, reinterpret_cast<unsigned*>(out.v_scale), out.nonfinite + kV);
  amax_to_scale_kernel<<<blocks_for(channels, kThreads), kThreads, 0, stream>>>(out.v_scale, channels);
  constexpr int kMaxD = 128;
  transpose_v_kernel<TV, kMaxD><<<dim3(static_cast<unsigned>(out.vt_keys / kTokenBlock), Hkv, B), kThreads, 0, stream>>>(
      typed<TV>(v), Sk, Hkv, D, out.v_scale, out.vt, out.vt_keys);
  check_cuda(cudaGetLastError(), "quantize_fp8 launch");
}

template <class TQ, class TK>
void dispatch_v(const StridedInput& q, const StridedInput& k, const StridedInput& v, bool smooth_k, float scale,
                const Fp8Buffers& out, cudaStream_t stream) {
  switch (v.type) {
    case ElementType::f32: return run<TQ, TK, float>(q, k, v, smooth_k, scale, out, stream);
    case ElementType::f16: return run<TQ, TK, __half>(q, k, v, smooth_k, scale, out, stream);
    case ElementType::bf16: return run<TQ, TK, __nv_bfloat16>(q, k, v, smooth_k, scale, out, stream);
  }
}

}  // namespace

std::int64_t padded_keys(std::int64_t Sk) { return (Sk + kTokenBlock - 1) / kTokenBlock * kTokenBlock; }

void quantize_fp8(const StridedInput& q, const StridedInput& k, const StridedInput& v, bool smooth_k,
                  float softmax_scale, const Fp8Buffers& out, cudaStream_t stream) {
  if (q.D != k.D || k.D != v.D || q.D > 128 || q.D % 16 != 0) throw Error("D", "must match across q, k, v and be ≤ 128");
  if (k.B != q.B || v.B != q.B || k.S != v.S || k.H != v.H) throw Error("k", "q, k and v shapes disagree");
  if (out.vt_keys != padded_keys(k.S)) throw Error("vt_keys", "must be padded_keys(Sk)");
  if (smooth_k && (out.k_mean == nullptr || out.lse_shift == nullptr))
    throw Error("smooth_k", "needs k_mean and lse_shift buffers");
  if (q.type != k.type) throw Error("k", "q and k must share one element type");
  switch (q.type) {
    case ElementType::f32: return dispatch_v<float, float>(q, k, v, smooth_k, softmax_scale, out, stream);
    case ElementType::f16: return dispatch_v<__half, __half>(q, k, v, smooth_k, softmax_scale, out, stream);
    case ElementType::bf16:
      return dispatch_v<__nv_bfloat16, __nv_bfloat16>(q, k, v, smooth_k, softmax_scale, out, stream);
  }
}

void check_finite(const Fp8Buffers& out, cudaStream_t stream) {
  int flags[3] = {0, 0, 0};
  check_cuda(cudaMemcpyAsync(flags, out.nonfinite, sizeof(flags), cudaMemcpyDeviceToHost, stream), "cudaMemcpyAsync");
  check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  if (flags[kQ] || flags[kK] || flags[kV]) {
    check_cuda(cudaMemsetAsync(out.nonfinite, 0, sizeof(flags), stream), "cudaMemsetAsync");
    const char* name = flags[kQ] ? "q" : flags[kK] ? "k" : "v";
    throw Error(name, "non-finite value in the input of the GPU quantizer");
  }
}

}  // namespace fp4attn::cuda_quantize
