// The fused FP8 quantizer kernel: a persistent grid running the units of
// work_order.hpp. Every arithmetic step mirrors the CPU quantizer so codes,
// scales and the smooth_k mean agree bit for bit:
//   amax     max |x| over a 128-token block (Q, K) or over the sequence per
//            channel (V), order-free; taken on the float bits, so Inf and NaN
//            show up as the largest magnitudes and are reported
//   scale    amax / 448 in fp32 (1 when zero)
//   code     RNE-satfinite E4M3 of the IEEE quotient x / scale (e4m3_quotient.cuh)
//   mean     fp4attn::sequence_mean's order: a double sum per 128-token chunk
//            (one k_stats unit each), the chunk sums added in ascending order
//            by the unit that completes the slice, / S in double, to float
//   smooth   k − mean in fp32
//
// Thread layout of a chunk (128 tokens × D): 512 threads; thread t owns the
// channels [8g, 8g + 8), g = t mod (D / 8), of token quad t / (D / 8) (one
// quad per thread at D = 128; at smaller D the high threads idle). A quad is
// the four tokens that one 32-bit word of Vᵀ holds (vt_key_of_slot), so V
// codes go to shared memory a word at a time, and Q / K rows are written
// 8 codes per thread.
#pragma once

#include <cuda/atomic>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "cuda/quantize/e4m3_quotient.cuh"
#include "cuda/quantize/quantize_fp8.hpp"
#include "cuda/quantize/segment.cuh"
#include "cuda/quantize/work_order.hpp"
#include "fp4attn/formats.hpp"
#include "fp4attn/quantize.hpp"

namespace fp4attn::cuda_quantize {

static_assert(kSequenceMeanChunk == kTokenBlock, "one k_stats unit sums exactly one chunk of the mean");

inline constexpr int kThreads = 512;
inline constexpr int kWarpSize = 32;
inline constexpr int kWarps = kThreads / kWarpSize;
inline constexpr int kMaxHeadDim = 128;
inline constexpr int kMinHeadDim = 2 * kSegment;  // the narrowest layout the lane arithmetic covers
inline constexpr int kQuadTokens = 4;             // keys of one 32-bit word of Vᵀ
inline constexpr int kQuadsPerChunk = kTokenBlock / kQuadTokens;
inline constexpr int kMaxItems = kQuadsPerChunk * (kMaxHeadDim / kSegment) / kThreads;  // (quad, segment) per thread
inline constexpr int kVtPitchWords = kQuadsPerChunk + 1;  // the pad word spreads the staging writes over banks
inline constexpr std::uint32_t kMagnitudeMask = 0x7FFFFFFFu;
inline constexpr std::uint32_t kInfBits = 0x7F800000u;  // |x| bits at or above this: Inf or NaN
inline constexpr std::uint32_t kFullWarp = 0xFFFFFFFFu;
inline constexpr unsigned kSpinSleepNs = 128;  // back-off while a slice's statistics complete
inline constexpr int kSumBatch = 16;            // tokens read ahead of the mean's double-add chain
enum NonfiniteSlot : int { kQ = 0, kK = 1, kV = 2 };

// Two CTAs of 512 threads per SM leave 64 registers a thread: enough for a
// 16-bit chunk (16 registers of data); fp32 data takes twice as many.
template <class T>
inline constexpr int kMinCtasPerSm = sizeof(T) == 2 ? 2 : 1;

static_assert(kMaxItems * kThreads == kQuadsPerChunk * (kMaxHeadDim / kSegment), "items must tile the chunk");
static_assert(kThreads % (kMaxHeadDim / kSegment) == 0, "a thread keeps one segment column for every item");

// Device view of Fp8Buffers::workspace (layout in quantize_fp8.cu).
struct Workspace {
  unsigned* ticket;      // next ticket
  unsigned* arrivals;    // per slice: statistics units done
  unsigned* ready;       // per slice: 1 once k_mean and v_scale are final
  unsigned* v_amax;      // per slice and channel: max |v| as float bits
  double* k_partial;     // per kv chunk and channel: double sum of the chunk
};

template <class T>
struct Job {
  InputView<T> q, k, v;
  int B, Hq, Hkv, Sq, Sk, D;
  int seg_shift;  // log2(D / kSegment)
  int q_blocks, k_blocks;
  unsigned arrivals_per_slice;
  bool smooth_k;
  float softmax_scale;
  Fp8Buffers out;
  Workspace ws;
  WorkOrder order;
  unsigned tickets;
};

struct SharedScratch {
  std::uint32_t warp_max[kWarps];
  std::uint32_t channel_max[kWarps][kMaxHeadDim];
  unsigned ticket[2];
  int last_arrival;
};

template <class T>
struct Chunk {
  Segment<T> seg[kMaxItems][kQuadTokens];
};

// ---- chunk geometry -------------------------------------------------------------

// Token (0..127) of element i of quad q: the keys of Vᵀ's slots 4q .. 4q + 3.
__device__ __forceinline__ int quad_token(int q, int i) {
  const int slot = kQuadTokens * q + i;
  return slot / kVtKeyGroup * kVtKeyGroup + vt_key_of_slot(slot % kVtKeyGroup);
}

template <class T>
__device__ __forceinline__ int segment_column(const Job<T>& job) {
  return static_cast<int>(threadIdx.x) & ((1 << job.seg_shift) - 1);
}

// Quad of item r of this thread, or -1 when the chunk has fewer items (D < 64).
template <class T>
__device__ __forceinline__ int item_quad(const Job<T>& job, int r) {
  const int item = static_cast<int>(threadIdx.x) + r * kThreads;
  return item < (kQuadsPerChunk << job.seg_shift) ? item >> job.seg_shift : -1;
}

// Sequence position of element i of item r, or -1 past the tensor's end.
template <class T>
__device__ __forceinline__ int item_token(const Job<T>& job, int r, int i, int s0, int S) {
  const int q = item_quad(job, r);
  if (q < 0) return -1;
  const int s = s0 + quad_token(q, i);
  return s < S ? s : -1;
}

template <L2Reuse R, class T>
__device__ __forceinline__ void load_chunk(const Job<T>& job, const InputView<T>& in, int b, int h, int s0, int S,
                                           Chunk<T>& c) {
  const int first_d = kSegment * segment_column(job);
#pragma unroll
  for (int r = 0; r < kMaxItems; ++r)
#pragma unroll
    for (int i = 0; i < kQuadTokens; ++i) {
      const int s = item_token(job, r, i, s0, S);
      if (s >= 0) load_segment<R>(in.segment(b, s, h, first_d), in.vector_loads, c.seg[r][i]);
      else zero_segment(c.seg[r][i]);
    }
}

// ---- reductions and synchronization ----------------------------------------------

__device__ __forceinline__ std::uint32_t magnitude_bits(float x) { return __float_as_uint(x) & kMagnitudeMask; }

__device__ __forceinline__ float fp8_scale_of(float amax) {
  const float scale = __fdiv_rn(amax, kE4M3Max);  // same rule as fp4attn::fp8_block_scale
  return scale > 0.0f ? scale : 1.0f;
}

// Max over the CTA. The caller's previous use of warp_max is behind a barrier.
__device__ __forceinline__ std::uint32_t block_max(std::uint32_t v, SharedScratch& sh) {
  v = __reduce_max_sync(kFullWarp, v);
  if (threadIdx.x % kWarpSize == 0) sh.warp_max[threadIdx.x / kWarpSize] = v;
  __syncthreads();
  std::uint32_t m = sh.warp_max[0];
#pragma unroll
  for (int w = 1; w < kWarps; ++w) m = max(m, sh.warp_max[w]);
  return m;
}

// Cross-CTA data (chunk sums, channel amax, k_mean, v_scale) is written before
// a release (fence, then the counter or flag) and read only with ld.global.cg,
// from L2, after that counter or flag has been seen: the data is in L2 by
// then. No acquire: on sm_90 it compiles to an invalidation of the SM's whole
// L1 (CCTL.IVALL) per unit, which the other CTAs then pay for.

// Blocks the CTA until slice j's mean and V scales are published.
__device__ __forceinline__ void wait_ready(unsigned* flag) {
  if (threadIdx.x == 0) {
    cuda::atomic_ref<unsigned, cuda::thread_scope_device> ready(*flag);
    while (ready.load(cuda::memory_order_relaxed) == 0) __nanosleep(kSpinSleepNs);
  }
  __syncthreads();
}

// Called by the unit that completes slice j's statistics: k_mean from the
// chunk sums in ascending chunk order, v_scale from the channel amax.
template <class T>
__device__ void finalize_slice(const Job<T>& job, int j) {
  const int d = static_cast<int>(threadIdx.x);
  if (d >= job.D) return;
  const std::int64_t channel = static_cast<std::int64_t>(j) * job.D + d;
  if (job.smooth_k) {
    const double* partial = job.ws.k_partial + static_cast<std::int64_t>(j) * job.k_blocks * job.D + d;
    double total = 0.0;
    for (int c = 0; c < job.k_blocks; ++c) total += __ldcg(partial + static_cast<std::int64_t>(c) * job.D);
    job.out.k_mean[channel] = __double2float_rn(__ddiv_rn(total, static_cast<double>(job.Sk)));
  }
  job.out.v_scale[channel] = fp8_scale_of(__uint_as_float(__ldcg(job.ws.v_amax + channel)));
}

// Counts one statistics unit of slice j as done; the last one finalizes the
// slice and releases its quantize units. The barrier orders every thread's
// writes before thread 0's release (the cooperative-groups grid barrier
// relies on the same rule).
template <class T>
__device__ void arrive(const Job<T>& job, int j, SharedScratch& sh) {
  __syncthreads();
  if (threadIdx.x == 0) {
    cuda::atomic_ref<unsigned, cuda::thread_scope_device> arrivals(job.ws.arrivals[j]);
    sh.last_arrival = arrivals.fetch_add(1u, cuda::memory_order_release) + 1u == job.arrivals_per_slice;
  }
  __syncthreads();
  if (!sh.last_arrival) return;
  finalize_slice(job, j);
  __syncthreads();
  if (threadIdx.x == 0) {
    cuda::atomic_ref<unsigned, cuda::thread_scope_device> ready(job.ws.ready[j]);
    ready.store(1u, cuda::memory_order_release);
  }
}

// ---- units ------------------------------------------------------------------------
// Inlined into the kernel's loop, so every Job field is an operand from the
// constant bank: behind a call, each would be a load through a generic pointer.

// Codes of one 128-token block of Q or K, minus `mean` per channel (zeros for
// Q and unsmoothed K: x − 0 is x, signed zeros included). Writes the codes
// and the block's scale, flags a non-finite block, and returns the scale;
// `words` receives this thread's codes (8 per token, channel 8g in the low byte).
template <class T>
__device__ float quantize_token_block(const Job<T>& job, const Chunk<T>& c, const float (&mean)[kSegment], int b,
                                      int h, int blk, int S, int H, std::uint8_t* codes, float* scales, int* nonfinite,
                                      SharedScratch& sh, std::uint32_t (&words)[kMaxItems][kQuadTokens][2]) {
  const int s0 = blk * kTokenBlock;
  std::uint32_t mag = 0;
#pragma unroll
  for (int r = 0; r < kMaxItems; ++r)
#pragma unroll
    for (int i = 0; i < kQuadTokens; ++i)
      if (item_token(job, r, i, s0, S) >= 0)
#pragma unroll
        for (int e = 0; e < kSegment; ++e) mag = max(mag, magnitude_bits(element(c.seg[r][i], e) - mean[e]));
  const std::uint32_t amax_bits = block_max(mag, sh);
  if (amax_bits >= kInfBits && threadIdx.x == 0) *nonfinite = 1;
  const float scale = fp8_scale_of(__uint_as_float(amax_bits));
  if (threadIdx.x == 0) scales[(static_cast<std::int64_t>(b) * H + h) * ((S + kTokenBlock - 1) / kTokenBlock) + blk] = scale;

  const E4M3Divisor div = make_divisor(scale);
  const int first_d = kSegment * segment_column(job);
#pragma unroll
  for (int r = 0; r < kMaxItems; ++r)
#pragma unroll
    for (int i = 0; i < kQuadTokens; ++i) {
      const Segment<T>& x = c.seg[r][i];
#pragma unroll
      for (int w = 0; w < 2; ++w) {
        const int e = 4 * w;
        words[r][i][w] =
            e4m3x2_quotient(element(x, e) - mean[e], element(x, e + 1) - mean[e + 1], div) |
            e4m3x2_quotient(element(x, e + 2) - mean[e + 2], element(x, e + 3) - mean[e + 3], div) << 16;
      }
      const int s = item_token(job, r, i, s0, S);
      if (s >= 0)
        __stcs(reinterpret_cast<uint2*>(codes + ((static_cast<std::int64_t>(b) * S + s) * H + h) * job.D + first_d),
               make_uint2(words[r][i][0], words[r][i][1]));
    }
  return scale;
}

template <class T>
__device__ __forceinline__ void kv_coordinates(const Job<T>& job, std::int64_t chunk, int& j, int& b, int& h,
                                               int& blk) {
  j = static_cast<int>(chunk / job.k_blocks);
  blk = static_cast<int>(chunk % job.k_blocks);
  b = j / job.Hkv;
  h = j % job.Hkv;
}

// K chunk, first read. smooth_k: double sum per channel in ascending s,
// staged through shared memory so one thread walks one channel. Otherwise the
// final codes (K needs no second read).
template <class T>
__device__ __forceinline__ void k_stats(const Job<T>& job, std::int64_t chunk, SharedScratch& sh, T* tile) {
  if (job.out.k == nullptr) return;  // V-only call: its tickets stay, K is never read
  int j, b, h, blk;
  kv_coordinates(job, chunk, j, b, h, blk);
  const int s0 = blk * kTokenBlock;
  Chunk<T> c;
  if (!job.smooth_k) {
    load_chunk<L2Reuse::last>(job, job.k, b, h, s0, job.Sk, c);
    const float zero[kSegment] = {};
    std::uint32_t words[kMaxItems][kQuadTokens][2];
    quantize_token_block(job, c, zero, b, h, blk, job.Sk, job.Hkv, job.out.k, job.out.k_scale,
                         job.out.nonfinite + kK, sh, words);
    return;
  }
  load_chunk<L2Reuse::keep>(job, job.k, b, h, s0, job.Sk, c);
  const int first_d = kSegment * segment_column(job);
  bool bad = false;
#pragma unroll
  for (int r = 0; r < kMaxItems; ++r)
#pragma unroll
    for (int i = 0; i < kQuadTokens; ++i) {
      const int s = item_token(job, r, i, s0, job.Sk);
      if (s < 0) continue;
#pragma unroll
      for (int e = 0; e < kSegment; ++e) bad |= magnitude_bits(element(c.seg[r][i], e)) >= kInfBits;
      store_segment(tile + (s - s0) * job.D + first_d, c.seg[r][i]);
    }
  if (bad) job.out.nonfinite[kK] = 1;
  __syncthreads();
  const int d = static_cast<int>(threadIdx.x);
  if (d < job.D) {
    const int tokens = min(kTokenBlock, job.Sk - s0);
    double sum = 0.0;
    int t = 0;
    // The adds form one dependent chain: read a batch ahead so that only the
    // DADD latency, not the shared-memory latency, sits on it.
    for (; t + kSumBatch <= tokens; t += kSumBatch) {
      float x[kSumBatch];
#pragma unroll
      for (int u = 0; u < kSumBatch; ++u) x[u] = to_float(tile[(t + u) * job.D + d]);
#pragma unroll
      for (int u = 0; u < kSumBatch; ++u) sum += static_cast<double>(x[u]);
    }
    for (; t < tokens; ++t) sum += static_cast<double>(to_float(tile[t * job.D + d]));
    job.ws.k_partial[chunk * job.D + d] = sum;
  }
  arrive(job, j, sh);
}

// V chunk, first read: per-channel amax into the slice's running maximum.
template <class T>
__device__ __forceinline__ void v_stats(const Job<T>& job, std::int64_t chunk, SharedScratch& sh) {
  int j, b, h, blk;
  kv_coordinates(job, chunk, j, b, h, blk);
  Chunk<T> c;
  load_chunk<L2Reuse::keep>(job, job.v, b, h, blk * kTokenBlock, job.Sk, c);
  std::uint32_t m[kSegment] = {};
#pragma unroll
  for (int r = 0; r < kMaxItems; ++r)
#pragma unroll
    for (int i = 0; i < kQuadTokens; ++i)
#pragma unroll
      for (int e = 0; e < kSegment; ++e) m[e] = max(m[e], magnitude_bits(element(c.seg[r][i], e)));
  // Lanes holding the same channels sit D / 8 apart: fold them, then the warps.
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize, warp = static_cast<int>(threadIdx.x) / kWarpSize;
#pragma unroll
  for (int e = 0; e < kSegment; ++e)
    for (int off = kWarpSize / 2; off >= (1 << job.seg_shift); off /= 2)
      m[e] = max(m[e], __shfl_xor_sync(kFullWarp, m[e], off));
  if (lane < (1 << job.seg_shift))
#pragma unroll
    for (int e = 0; e < kSegment; ++e) sh.channel_max[warp][kSegment * lane + e] = m[e];
  __syncthreads();
  const int d = static_cast<int>(threadIdx.x);
  if (d < job.D) {
    std::uint32_t amax = 0;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) amax = max(amax, sh.channel_max[w][d]);
    if (amax >= kInfBits) job.out.nonfinite[kV] = 1;
    atomicMax(job.ws.v_amax + static_cast<std::int64_t>(j) * job.D + d, amax);
  }
  arrive(job, j, sh);
}

// K chunk, second read (smooth_k): k − mean → codes and block scale.
template <class T>
__device__ __forceinline__ void k_quantize(const Job<T>& job, std::int64_t chunk, SharedScratch& sh) {
  int j, b, h, blk;
  kv_coordinates(job, chunk, j, b, h, blk);
  Chunk<T> c;
  load_chunk<L2Reuse::last>(job, job.k, b, h, blk * kTokenBlock, job.Sk, c);
  wait_ready(job.ws.ready + j);
  float mean[kSegment];
  const float* slice_mean = job.out.k_mean + static_cast<std::int64_t>(j) * job.D + kSegment * segment_column(job);
#pragma unroll
  for (int e = 0; e < kSegment; ++e) mean[e] = __ldcg(slice_mean + e);
  std::uint32_t words[kMaxItems][kQuadTokens][2];
  quantize_token_block(job, c, mean, b, h, blk, job.Sk, job.Hkv, job.out.k, job.out.k_scale, job.out.nonfinite + kK,
                       sh, words);
}

// V chunk, second read: codes of v / scale[d], staged as Vᵀ words (a quad's
// four keys of one channel) and written out one 128-key row per channel.
template <class T>
__device__ __forceinline__ void v_quantize(const Job<T>& job, std::int64_t chunk, SharedScratch& sh, std::uint32_t* tile) {
  int j, b, h, blk;
  kv_coordinates(job, chunk, j, b, h, blk);
  Chunk<T> c;
  load_chunk<L2Reuse::last>(job, job.v, b, h, blk * kTokenBlock, job.Sk, c);
  wait_ready(job.ws.ready + j);
  const int g = segment_column(job);
  float scale[kSegment];
  const float* slice_scale = job.out.v_scale + static_cast<std::int64_t>(j) * job.D + kSegment * g;
#pragma unroll
  for (int e = 0; e < kSegment; ++e) scale[e] = __ldcg(slice_scale + e);
#pragma unroll
  for (int e = 0; e < kSegment; ++e) {
    const E4M3Divisor div = make_divisor(scale[e]);
#pragma unroll
    for (int r = 0; r < kMaxItems; ++r) {
      const int q = item_quad(job, r);
      if (q < 0) continue;
      const Segment<T>(&x)[kQuadTokens] = c.seg[r];  // keys past Sk hold zeros, whose code is 0
      tile[(kSegment * g + e) * kVtPitchWords + q] = e4m3x2_quotient(element(x[0], e), element(x[1], e), div) |
                                                     e4m3x2_quotient(element(x[2], e), element(x[3], e), div) << 16;
    }
  }
  __syncthreads();
  std::uint8_t* rows = job.out.vt + static_cast<std::int64_t>(j) * job.D * job.out.vt_keys + blk * kTokenBlock;
  for (int idx = static_cast<int>(threadIdx.x); idx < job.D * kQuadsPerChunk; idx += kThreads) {
    const int d = idx / kQuadsPerChunk, w = idx % kQuadsPerChunk;
    __stcs(reinterpret_cast<unsigned*>(rows + d * job.out.vt_keys) + w, tile[d * kVtPitchWords + w]);
  }
}

// Q chunk, single read: codes and block scale; with smooth_k also the LSE
// correction softmax_scale · Σ_d q_deq[d] · k_mean[d] of each token.
template <class T>
__device__ __forceinline__ void q_quantize(const Job<T>& job, std::int64_t chunk, SharedScratch& sh) {
  const int blk = static_cast<int>(chunk % job.q_blocks);
  const int bh = static_cast<int>(chunk / job.q_blocks);
  const int h = bh % job.Hq, b = bh / job.Hq;
  const int s0 = blk * kTokenBlock;
  Chunk<T> c;
  load_chunk<L2Reuse::last>(job, job.q, b, h, s0, job.Sq, c);
  const float zero[kSegment] = {};
  std::uint32_t words[kMaxItems][kQuadTokens][2];
  const float scale = quantize_token_block(job, c, zero, b, h, blk, job.Sq, job.Hq, job.out.q, job.out.q_scale,
                                           job.out.nonfinite + kQ, sh, words);
  if (!job.smooth_k) return;

  const int j = b * job.Hkv + h / (job.Hq / job.Hkv);
  wait_ready(job.ws.ready + j);
  const int g = segment_column(job);
  float mean[kSegment];
  const float* slice_mean = job.out.k_mean + static_cast<std::int64_t>(j) * job.D + kSegment * g;
#pragma unroll
  for (int e = 0; e < kSegment; ++e) mean[e] = __ldcg(slice_mean + e);
#pragma unroll
  for (int r = 0; r < kMaxItems; ++r)
#pragma unroll
    for (int i = 0; i < kQuadTokens; ++i) {
      float dot = 0.0f;
#pragma unroll
      for (int p = 0; p < kSegment / 2; ++p) {
        const std::uint32_t pair = (words[r][i][p / 2] >> (16 * (p % 2))) & 0xFFFFu;
        const float2 q = __half22float2(
            __half2(__nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(pair), __NV_E4M3)));
        dot = fmaf(q.x * scale, mean[2 * p], dot);
        dot = fmaf(q.y * scale, mean[2 * p + 1], dot);
      }
      // The lanes of one token are the D / 8 consecutive lanes of its quad.
      for (int off = 1; off < (1 << job.seg_shift); off *= 2) dot += __shfl_xor_sync(kFullWarp, dot, off);
      const int s = item_token(job, r, i, s0, job.Sq);
      if (g == 0 && s >= 0)
        job.out.lse_shift[(static_cast<std::int64_t>(b) * job.Hq + h) * job.Sq + s] = job.softmax_scale * dot;
    }
}

// ---- the kernel -------------------------------------------------------------------

template <class T>
__global__ void __launch_bounds__(kThreads, kMinCtasPerSm<T>) quantize_fp8_kernel(const __grid_constant__ Job<T> job) {
  extern __shared__ __align__(16) unsigned char tile[];  // K chunk (k_stats) or Vᵀ words (v_quantize)
  __shared__ SharedScratch sh;
  // Thread 0 takes the next ticket while the CTA works on the current one.
  if (threadIdx.x == 0) sh.ticket[0] = atomicAdd(job.ws.ticket, 1u);
  __syncthreads();
  int buf = 0;
  for (unsigned t = sh.ticket[0]; t < job.tickets; t = sh.ticket[buf]) {
    unsigned next = 0;
    if (threadIdx.x == 0) next = atomicAdd(job.ws.ticket, 1u);
    const Unit u = job.order.unit(t);
    switch (u.kind) {
      case UnitKind::k_stats: k_stats(job, u.chunk, sh, reinterpret_cast<T*>(tile)); break;
      case UnitKind::v_stats: v_stats(job, u.chunk, sh); break;
      case UnitKind::k_quantize: k_quantize(job, u.chunk, sh); break;
      case UnitKind::v_quantize: v_quantize(job, u.chunk, sh, reinterpret_cast<std::uint32_t*>(tile)); break;
      case UnitKind::q_quantize: q_quantize(job, u.chunk, sh); break;
    }
    buf ^= 1;
    if (threadIdx.x == 0) sh.ticket[buf] = next;
    __syncthreads();
  }
}

}  // namespace fp4attn::cuda_quantize
