// The FP8 quantizer's kernels, three launches on one stream:
//   fp8_stats_kernel     K's chunk sums (smooth_k) and V's channel amax: one
//                        read of K and V
//   fp8_finalize_kernel  k_mean and v_scale per (slice, channel)
//   fp8_quantize_kernel  one CTA per 128-token block of Q, K or V: codes,
//                        block scales, Vᵀ, the smooth_k LSE correction, and
//                        on request Qᵀ and Kᵀ (the backward's operands)
// Every arithmetic step mirrors the CPU quantizer so codes, scales and the
// smooth_k mean agree bit for bit:
//   amax     max |x| over a 128-token block (Q, K) or over the sequence per
//            channel (V), order-free; taken on the float bits, so Inf and NaN
//            show up as the largest magnitudes and are reported
//   scale    amax / 448 in fp32 (1 when zero)
//   code     RNE-satfinite E4M3 of the IEEE quotient x / scale (e4m3_quotient.cuh)
//   mean     fp4attn::sequence_mean's order: a double sum per 128-token chunk
//            in ascending s, the chunk sums added in ascending order, / S in
//            double, to float
//   smooth   k − mean in fp32
//
// Why plain launches: the statistics of a whole (b, h) slice (K's mean, V's
// per-channel scale) must be final before its first code, so K and V are read
// twice whatever the schedule. Kernel order on the stream is the grid-wide
// barrier. The finalize and quantize kernels are programmatic dependent
// launches (perf log q9): each may start while its predecessor ends and
// waits for it in cudaGridDependencySynchronize; a quantize CTA loads its
// block before that wait. Every CTA of the quantize kernel loads, reduces and
// stores one block, and the SM's resident CTAs keep loads in flight for one
// another. The quantize kernel takes the K and V blocks in the
// reverse of the statistics kernel's order, so its first blocks are those
// the statistics kernel read last, still in L2. One persistent launch that
// codes each (b, h) slice a few slices after its statistics, so that the
// second read comes from L2, cut HBM reads from 676 to 411 MB at S = 4k but
// ran 0–10 % slower or worse (perf log q8): a CTA working through items one
// at a time, some waiting on others' statistics, keeps fewer loads in flight
// than a grid of independent CTAs.
#pragma once

#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "cuda/quantize/byte_transpose.cuh"
#include "cuda/quantize/e4m3_quotient.cuh"
#include "cuda/quantize/fast_div.hpp"
#include "cuda/quantize/quantize_fp8.hpp"
#include "cuda/quantize/segment.cuh"
#include "fp4attn/formats.hpp"
#include "fp4attn/quantize.hpp"

namespace fp4attn::cuda_quantize {

static_assert(kSequenceMeanChunk == kTokenBlock, "a statistics CTA sums exactly one chunk of the mean");

inline constexpr int kWarpSize = 32;
inline constexpr int kMaxHeadDim = 128;    // the lanes of the quantize kernel's common instances
inline constexpr int kWideHeadDim = 256;   // its wide instance's (D above kMaxHeadDim, forward operands only)
inline constexpr int kMinHeadDim = 2 * kSegment;  // the narrowest layout the lane arithmetic covers
inline constexpr std::uint32_t kMagnitudeMask = 0x7FFFFFFFu;
inline constexpr std::uint32_t kInfBits = 0x7F800000u;  // |x| bits at or above this: Inf or NaN
inline constexpr std::uint32_t kFullWarp = 0xFFFFFFFFu;
enum NonfiniteSlot : int { kQ = 0, kK = 1, kV = 2 };

// ---- statistics ---------------------------------------------------------------------
// A thread walks four channels down the 128 tokens of a chunk, so each
// channel's sum is one dependent chain in ascending s, as the CPU adds.
inline constexpr int kStatsThreads = 128;
inline constexpr int kStatsBatch = 16;  // tokens loaded ahead of the double-add chains (8: 10 % slower, perf log q5)
// CTAs per SM for 16-bit inputs: 6 (80 registers; a batch held as loaded,
// QuadBits, takes 32) against the 4 that ptxas's free choice of 128 registers
// left: −7 % for the quantizer with smooth_k at S = 4k (perf log q10; 8 CTAs at
// 64 registers gained half as much, ptxas then issues 8 of a batch's 16 loads
// ahead). fp32 batches take 64 registers alone.
template <class T>
inline constexpr int kStatsCtasPerSm = sizeof(T) == sizeof(float) ? 4 : 6;

// ---- quantize -----------------------------------------------------------------------
// A block (128 tokens × D) is one CTA of 2·D threads (quantize_threads), so
// that every thread holds kMaxItems = 2 (quad, segment) items at every D:
// thread t owns the channels [8g, 8g + 8), g = t mod (D / 8), of the token
// quads t / (D / 8) and t / (D / 8) + 16. (A fixed 256 threads left D = 64
// one item a thread and the kernel bound by its per-block instructions:
// perf log q7.) A quad is the four tokens that one 32-bit word of Vᵀ holds
// (vt_key_of_slot), so V codes go to shared memory a word at a time, and
// Q / K rows are written 8 codes per store. A token's D / 8 segments sit in
// consecutive lanes: a warp's load covers whole rows.
inline constexpr int kThreads = 256;  // the largest CTA (D = 128); the finalize kernel's size
inline constexpr int kWarps = kThreads / kWarpSize;
inline constexpr int kQuadTokens = 4;  // keys of one 32-bit word of Vᵀ
inline constexpr int kQuadsPerBlock = kTokenBlock / kQuadTokens;
inline constexpr int kMaxItems = kQuadsPerBlock * (kMaxHeadDim / kSegment) / kThreads;  // (quad, segment) per thread
inline constexpr int kVtPitchWords = kQuadsPerBlock + 1;  // the pad word spreads the staging writes over banks

// Three CTAs per SM leave 80 registers a thread, of which a 16-bit block
// takes 32 (2 items × 4 tokens × 4 words); fp32 blocks take twice as many.
// Four CTAs (64 registers) spill and measured 1–3 % slower, two 12 % slower
// (perf log q3).
template <class T>
inline constexpr int kQuantizeCtasPerSm = sizeof(T) == 2 ? 3 : 2;
// The wide instance's CTAs have 512 threads. Two per SM leave 64 registers
// a thread, where 16-bit blocks spill 64 bytes (ptxas -v), and still ran
// 15–20 % faster than one CTA at 128 registers without spills (docs/perf-log.md,
// d256); fp32 blocks take one CTA's 128.
template <class T, int kLanes>
inline constexpr int kQuantizeCtasFor = kLanes == kMaxHeadDim ? kQuantizeCtasPerSm<T> : sizeof(T) == 2 ? 2 : 1;

static_assert(kMaxItems * kThreads == kQuadsPerBlock * (kMaxHeadDim / kSegment), "items must tile the block");
static_assert(kThreads % (kMaxHeadDim / kSegment) == 0, "a thread keeps one segment column for every item");

// Threads of a quantize CTA for head dim D: 2·D, two items a thread.
__host__ __device__ constexpr int quantize_threads(int D) { return kQuadsPerBlock * (D / kSegment) / kMaxItems; }
static_assert(quantize_threads(kMaxHeadDim) == kThreads && quantize_threads(16) == kWarpSize,
              "whole warps from D = 16 to 128");
static_assert(quantize_threads(kWideHeadDim) <= 1024, "the wide instance's CTA");

// Device view of Fp8Buffers::workspace (layout in quantize_fp8.cu).
struct Workspace {
  unsigned* v_amax;   // per slice and channel: max |v| as float bits (reset by the call)
  double* k_partial;  // per slice, chunk and channel: the chunk's double sum
};

// Where batch entry b's tokens sit in the per-token outputs. Dense: entry b
// of (B, S, H, D) codes and of (B, H, S) row statistics, (B, H, blocks)
// scales and (B, H, D, 128·blocks) transposed copies. Packed sequences: rows
// row0 .. of a single entry of `rows` rows (the tile-aligned layout), every
// index below taking row0 (or row0 / 128 blocks) on top.
struct OutputPlace {
  int b;       // the outputs' batch index
  int row0;    // first row, a multiple of kTokenBlock
  int rows;    // rows per batch entry of the codes and row statistics: S, or the packed layout's
  int blocks;  // token blocks per batch entry of the scales; 128·blocks is the transposed copies' pitch
};

template <class T>
struct Job {
  InputView<T> q, k, v;
  int B, Hq, Hkv, Sq, Sk, D;
  int seg_shift;  // log2(D / kSegment)
  std::int64_t code_pitch;  // bytes between (b, s, h) rows of the q and k codes (Fp8Buffers::code_pitch)
  int q_blocks, k_blocks;
  bool smooth_k;
  float softmax_scale;
  Fp8Buffers out;
  InputView<T> dot_with;  // QRowDot: read when dot_out is set
  float* dot_out;
  std::int64_t dot_pitch;
  Workspace ws;
  // The quantize kernel's block index → (b, h, block), see fp8_quantize_kernel.
  FastDiv by_hkv, by_hq, by_group, by_k_blocks, by_q_blocks;
  // Packed sequences (StridedInput::cu_seqlens of q and of k and v), or null:
  // then Sq and Sk are the longest (the grid's), batch entry b has its own
  // number of tokens, which is all its statistics and codes see, and its
  // outputs sit at rows out.rows_q[b] (out.rows_k[b]) of the tile-aligned
  // layouts of out.q_rows (out.k_rows) rows (cuda/common/packed_rows.hpp).
  const int* cu_q;
  const int* cu_k;

  __device__ int q_tokens(int b) const { return cu_q != nullptr ? cu_q[b + 1] - cu_q[b] : Sq; }
  __device__ int k_tokens(int b) const { return cu_k != nullptr ? cu_k[b + 1] - cu_k[b] : Sk; }
  __device__ OutputPlace q_place(int b) const {
    return cu_q != nullptr ? OutputPlace{0, out.rows_q[b], static_cast<int>(out.q_rows),
                                         static_cast<int>(out.q_rows) / kTokenBlock}
                           : OutputPlace{b, 0, Sq, q_blocks};
  }
  __device__ OutputPlace k_place(int b) const {
    return cu_k != nullptr ? OutputPlace{0, out.rows_k[b], static_cast<int>(out.k_rows),
                                         static_cast<int>(out.k_rows) / kTokenBlock}
                           : OutputPlace{b, 0, Sk, k_blocks};
  }
};

__device__ __forceinline__ std::uint32_t magnitude_bits(float x) { return __float_as_uint(x) & kMagnitudeMask; }

__device__ __forceinline__ float fp8_scale_of(float amax) {
  const float scale = __fdiv_rn(amax, kE4M3Max);  // same rule as fp4attn::fp8_block_scale
  return scale > 0.0f ? scale : 1.0f;
}

// ---- fp8_stats_kernel -----------------------------------------------------------------
// Grid: x = chunk · (channel blocks) + channel block, y = b, z = tensor (0: V,
// 1: K, present with smooth_k; a call without V has z = 0: K). A channel
// block is kStatsThreads quads (4 channels) of the (h, d) channels of one
// token. Four channels a thread with 16 tokens in flight: eight channels
// with 8 tokens (the same bytes in flight per thread, half the threads)
// measured 2 % slower, four with 8 tokens 10 % slower (perf log q5).

template <class T>
__global__ void __launch_bounds__(kStatsThreads, kStatsCtasPerSm<T>)
    fp8_stats_kernel(const __grid_constant__ Job<T> job, int channel_blocks) {
  // The finalize kernel may launch now; it waits for this grid before reading.
  cudaTriggerProgrammaticLaunchCompletion();
  // z = 1 is K when V has statistics too; a call without V has K's alone.
  const bool k_tensor = blockIdx.z == 1 || job.out.vt == nullptr;
  const InputView<T> in = k_tensor ? job.k : job.v;
  const int chunk = static_cast<int>(blockIdx.x) / channel_blocks;
  const int quad = (static_cast<int>(blockIdx.x) % channel_blocks) * kStatsThreads + static_cast<int>(threadIdx.x);
  const int b = static_cast<int>(blockIdx.y);
  if (quad * kQuad >= job.Hkv * job.D) return;
  const int h = (quad * kQuad) / job.D, d0 = (quad * kQuad) % job.D;
  // Chunks past a packed sequence's end are not its own (in the packed
  // layout the next sequence's chunks sit there).
  const int s0 = chunk * kTokenBlock, tokens = min(kTokenBlock, job.k_tokens(b) - s0);
  if (tokens <= 0) return;
  const T* p = in.segment(b, s0, h, d0);

  double sum[kQuad] = {};
  std::uint32_t mag[kQuad] = {};
  const auto take = [&](const float (&x)[kQuad]) {
#pragma unroll
    for (int e = 0; e < kQuad; ++e) {
      mag[e] = max(mag[e], magnitude_bits(x[e]));
      if (k_tensor) sum[e] += static_cast<double>(x[e]);
    }
  };
  // K and V are read again by the quantize kernel: keep them in L2.
  walk_quads<kStatsBatch, L2Reuse::keep>(p, in.stride_s, tokens, in.vector_loads, take);

  const std::int64_t channel = (static_cast<std::int64_t>(b) * job.Hkv + h) * job.D + d0;
  std::uint32_t worst = 0;
#pragma unroll
  for (int e = 0; e < kQuad; ++e) worst = max(worst, mag[e]);
  if (k_tensor) {
    if (worst >= kInfBits) job.out.nonfinite[kK] = 1;
    const OutputPlace at = job.k_place(b);
    double* partial = job.ws.k_partial +
                      ((static_cast<std::int64_t>(at.b) * job.Hkv + h) * at.blocks + at.row0 / kTokenBlock + chunk) *
                          job.D +
                      d0;
#pragma unroll
    for (int e = 0; e < kQuad; ++e) partial[e] = sum[e];
  } else {
    if (worst >= kInfBits) job.out.nonfinite[kV] = 1;
#pragma unroll
    for (int e = 0; e < kQuad; ++e) atomicMax(job.ws.v_amax + channel + e, mag[e]);
  }
}

// ---- fp8_finalize_kernel --------------------------------------------------------------
// With smooth_k a CTA per kSumColumns channels of one slice: k_mean from the
// chunk sums in ascending chunk order (ordered_column_sums; a ChunkSumTile
// of dynamic shared memory), and their v_scale. Without, a thread per
// channel: v_scale from the channel amax.
template <class T>
__global__ void __launch_bounds__(kThreads) fp8_finalize_kernel(const __grid_constant__ Job<T> job) {
  extern __shared__ __align__(16) unsigned char smem[];
  cudaTriggerProgrammaticLaunchCompletion();  // the quantize kernel may launch; it waits for this grid
  cudaGridDependencySynchronize();            // the statistics are complete and visible
  std::int64_t channel;
  if (job.smooth_k) {
    const int groups = (job.D + kSumColumns - 1) / kSumColumns;
    const std::int64_t slice = blockIdx.x / groups;
    const int d0 = static_cast<int>(blockIdx.x % groups) * kSumColumns, columns = min(kSumColumns, job.D - d0);
    const int b = static_cast<int>(slice / job.Hkv), h = static_cast<int>(slice % job.Hkv);
    // The entry's own chunks, in ascending order.
    const OutputPlace at = job.k_place(b);
    const int tokens = job.k_tokens(b), chunks = (tokens + kTokenBlock - 1) / kTokenBlock;
    const std::int64_t first_chunk =
        (static_cast<std::int64_t>(at.b) * job.Hkv + h) * at.blocks + at.row0 / kTokenBlock;
    const double total = ordered_column_sums<kWarps>(job.ws.k_partial + first_chunk * job.D + d0, job.D, chunks,
                                                     columns, *reinterpret_cast<ChunkSumTile*>(smem));
    const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
    if (threadIdx.x >= kWarpSize || lane >= columns) return;
    channel = slice * job.D + d0 + lane;
    job.out.k_mean[channel] = __double2float_rn(__ddiv_rn(total, static_cast<double>(tokens)));
  } else {
    channel = static_cast<std::int64_t>(blockIdx.x) * kThreads + threadIdx.x;
    if (channel >= static_cast<std::int64_t>(job.B) * job.Hkv * job.D) return;
  }
  if (job.out.vt != nullptr) job.out.v_scale[channel] = fp8_scale_of(__uint_as_float(job.ws.v_amax[channel]));
}

// ---- fp8_quantize_kernel: block geometry ---------------------------------------------

// Token (0..127) of element i of quad q: the keys of Vᵀ's slots 4q .. 4q + 3.
// With slot 4q + i inside a 32-key group, vt_key_of_slot gives
// quad_base(q) + quad_offset(i), so a thread keeps one base per quad.
__host__ __device__ constexpr int quad_base(int q) {
  return q / 8 * kVtKeyGroup + 16 * (q / 4 % 2) + 2 * (q % 4);
}
__host__ __device__ constexpr int quad_offset(int i) { return (i & 1) + 8 * (i >> 1); }
constexpr bool quads_restate_vt_key_of_slot() {
  for (int q = 0; q < kQuadsPerBlock; ++q)
    for (int i = 0; i < kQuadTokens; ++i) {
      const int slot = kQuadTokens * q + i;
      if (quad_base(q) + quad_offset(i) != slot / kVtKeyGroup * kVtKeyGroup + vt_key_of_slot(slot % kVtKeyGroup))
        return false;
    }
  return true;
}
static_assert(quads_restate_vt_key_of_slot(), "quad_base and quad_offset must give vt_key_of_slot's keys");

struct ThreadItems {
  int column;           // segment column g: channels [8g, 8g + 8)
  int first_d;          // 8g
  bool present;         // 8g < D (false only on padded lanes, fp8_quantize_kernel's kPaddedLanes)
  int quad[kMaxItems];  // quad of item r
  int base[kMaxItems];  // quad_base of item r
};

// With quantize_threads(D) threads, item r of thread t is t + r · blockDim.x
// (D rounded up to a power of two with kPaddedLanes).
template <bool kPaddedLanes, class T>
__device__ __forceinline__ ThreadItems thread_items(const Job<T>& job) {
  ThreadItems items;
  items.column = static_cast<int>(threadIdx.x) & ((1 << job.seg_shift) - 1);
  items.first_d = kSegment * items.column;
  items.present = !kPaddedLanes || items.first_d < job.D;
#pragma unroll
  for (int r = 0; r < kMaxItems; ++r) {
    const int item = static_cast<int>(threadIdx.x + r * blockDim.x);
    items.quad[r] = item >> job.seg_shift;
    items.base[r] = quad_base(items.quad[r]);
  }
  return items;
}

// Sequence position of element i of item r, or -1 past the tensor's end.
__device__ __forceinline__ int item_token(const ThreadItems& items, int r, int i, int s0, int S) {
  const int s = s0 + items.base[r] + quad_offset(i);
  return s < S ? s : -1;
}

template <class T>
struct Block {
  Segment<T> seg[kMaxItems][kQuadTokens];
};

// A block whose every segment is in the tensor and on a 16-byte boundary:
// no per-element bounds checks, one 16-byte load per segment.
template <class T>
__device__ __forceinline__ bool whole_block(const InputView<T>& in, int s0, int S) {
  return sizeof(T) == 2 && in.vector_loads && s0 + kTokenBlock <= S;
}

// Item r's four token segments (zeros past the tensor's end).
template <L2Reuse R, class T>
__device__ __forceinline__ void load_item(const ThreadItems& items, const InputView<T>& in, const T* first, int r,
                                          int s0, int S, bool whole, Segment<T> (&seg)[kQuadTokens]) {
  if constexpr (sizeof(T) == 2) {
    if (whole) {
      const T* row = first + items.base[r] * in.stride_s;
#pragma unroll
      for (int i = 0; i < kQuadTokens; ++i) {
        const uint4 v = load_global<R>(reinterpret_cast<const uint4*>(row + quad_offset(i) * in.stride_s));
        seg[i].w[0] = v.x, seg[i].w[1] = v.y, seg[i].w[2] = v.z, seg[i].w[3] = v.w;
      }
      return;
    }
  }
#pragma unroll
  for (int i = 0; i < kQuadTokens; ++i) {
    const int s = item_token(items, r, i, s0, S);
    if (s >= 0) load_segment<R>(first + (s - s0) * in.stride_s, in.vector_loads, seg[i]);
    else zero_segment(seg[i]);
  }
}

template <L2Reuse R, class T>
__device__ __forceinline__ void load_block(const ThreadItems& items, const InputView<T>& in, int b, int h, int s0,
                                           int S, bool whole, Block<T>& c) {
  if (!items.present) {  // a padded lane: zeros, as the missing channels would be
#pragma unroll
    for (int r = 0; r < kMaxItems; ++r)
#pragma unroll
      for (int i = 0; i < kQuadTokens; ++i) zero_segment(c.seg[r][i]);
    return;
  }
  const T* first = in.segment(b, s0, h, items.first_d);
#pragma unroll
  for (int r = 0; r < kMaxItems; ++r) load_item<R>(items, in, first, r, s0, S, whole, c.seg[r]);
}

// 8 floats of a per-channel array, this thread's channels: two 16-byte
// loads when the array allows them (the caller's statistics arrays need not).
__device__ __forceinline__ void load_channels(const float* from, float (&out)[kSegment]) {
  if (reinterpret_cast<std::uintptr_t>(from) % 16 == 0) {
    const float4 a = reinterpret_cast<const float4*>(from)[0], b = reinterpret_cast<const float4*>(from)[1];
    out[0] = a.x, out[1] = a.y, out[2] = a.z, out[3] = a.w, out[4] = b.x, out[5] = b.y, out[6] = b.z, out[7] = b.w;
    return;
  }
#pragma unroll
  for (int e = 0; e < kSegment; ++e) out[e] = from[e];
}

// Max over the CTA; `warp_max` is free (every earlier read of it is behind a barrier).
template <int kCtaWarps>
__device__ __forceinline__ std::uint32_t block_max(std::uint32_t v, std::uint32_t (&warp_max)[kCtaWarps]) {
  v = __reduce_max_sync(kFullWarp, v);
  if (threadIdx.x % kWarpSize == 0) warp_max[threadIdx.x / kWarpSize] = v;
  __syncthreads();
  const int warps = static_cast<int>(blockDim.x) / kWarpSize;
  std::uint32_t m = warp_max[0];
#pragma unroll
  for (int w = 1; w < kCtaWarps; ++w)
    if (w < warps) m = max(m, warp_max[w]);
  return m;
}

// Largest |x| of a thread's segments as float bits (elements past the tensor
// hold zeros). 16-bit inputs: the magnitudes' bit patterns order like their
// values, so two lanes of a word go through one packed max; Inf and NaN stay
// the largest.
template <class T>
__device__ __forceinline__ std::uint32_t segments_magnitude(const Block<T>& c) {
  if constexpr (sizeof(T) == 2) {
    std::uint32_t m2 = 0;
#pragma unroll
    for (int r = 0; r < kMaxItems; ++r)
#pragma unroll
      for (int i = 0; i < kQuadTokens; ++i)
#pragma unroll
        for (int w = 0; w < kSegment / 2; ++w) m2 = __vmaxu2(m2, c.seg[r][i].w[w] & 0x7FFF7FFFu);
    const unsigned short m = static_cast<unsigned short>(max(m2 & 0xFFFFu, m2 >> 16));
    if constexpr (std::is_same_v<T, __nv_bfloat16>) return static_cast<std::uint32_t>(m) << 16;
    else return __float_as_uint(__half2float(__ushort_as_half(m)));
  } else {
    std::uint32_t m = 0;
#pragma unroll
    for (int r = 0; r < kMaxItems; ++r)
#pragma unroll
      for (int i = 0; i < kQuadTokens; ++i)
#pragma unroll
        for (int e = 0; e < kSegment; ++e) m = max(m, magnitude_bits(element(c.seg[r][i], e)));
    return m;
  }
}

// ---- fp8_quantize_kernel: units -------------------------------------------------------

// Writes a staged transposed block (D rows of 128 codes as 32 words each,
// pitch kVtPitchWords) to `rows`, one 128-byte run per row `pitch` bytes
// apart. Each thread stores 16 bytes of one row per store (rows are 16-byte
// aligned: the host checks the buffer, and pitches are multiples of 128).
// kLimitRows: only rows below `limit` (the lanes were padded past D).
template <bool kLimitRows = false>
__device__ __forceinline__ void store_transposed_block(const std::uint32_t* tile, std::uint8_t* rows,
                                                       std::int64_t pitch, int limit = 0) {
  constexpr int kChunksPerRow = kTokenBlock / 16;
  const int chunk = static_cast<int>(threadIdx.x) % kChunksPerRow;
  // quantize_threads(D) = 2·D threads, kChunksPerRow to a row: D / 4 rows a pass.
  constexpr int kPasses = kChunksPerRow / kMaxItems;
  static_assert(kPasses * kMaxItems == kChunksPerRow, "whole passes");
#pragma unroll
  for (int k = 0; k < kPasses; ++k) {
    const int d = static_cast<int>(threadIdx.x) / kChunksPerRow + k * (static_cast<int>(blockDim.x) / kChunksPerRow);
    if (kLimitRows && d >= limit) continue;
    const std::uint32_t* from = tile + d * kVtPitchWords + 4 * chunk;
    __stcs(reinterpret_cast<uint4*>(rows + static_cast<std::int64_t>(d) * pitch) + chunk,
           make_uint4(from[0], from[1], from[2], from[3]));
  }
}

// The transposed copy of a Q or K block: each item's four token words (four
// channels each) become four channel words of four tokens by byte permutes,
// staged in `tile` as Vᵀ words are, then stored row by row. Tokens past S
// get code 0 (smoothed K's pad would otherwise code −mean).
__device__ __forceinline__ void store_transposed_codes(const ThreadItems& items, bool whole, int s0,
                                                       int S, std::uint32_t (&words)[kMaxItems][kQuadTokens][2],
                                                       std::uint32_t* tile, std::uint8_t* rows, std::int64_t pitch) {
#pragma unroll
  for (int r = 0; r < kMaxItems; ++r)
#pragma unroll
    for (int w = 0; w < 2; ++w) {
      std::uint32_t t[kQuadTokens];
#pragma unroll
      for (int i = 0; i < kQuadTokens; ++i) t[i] = whole || item_token(items, r, i, s0, S) >= 0 ? words[r][i][w] : 0u;
      // byte i of channel c's word is token i's byte c
      std::uint32_t c[4];
      transpose_bytes_4x4(t, c);
      std::uint32_t* column = tile + (items.first_d + 4 * w) * kVtPitchWords + items.quad[r];
#pragma unroll
      for (int k = 0; k < 4; ++k) column[k * kVtPitchWords] = c[k];
    }
  __syncthreads();
  store_transposed_block(tile, rows, pitch);
}

// Codes of one 128-token block of Q or K, minus `mean` per channel when
// `smoothed` (K with smooth_k); the entry's tokens are those below S, its
// outputs where `at` places them. Writes
// the codes and the block's scale, flags a non-finite block, and returns the
// scale; `words` receives this thread's codes (8 per token, channel 8g in
// the low byte).
template <int kCtaWarps, class T>
__device__ __forceinline__ float quantize_token_block(const Job<T>& job, const ThreadItems& items, Block<T>& c,
                                                      bool smoothed, const float (&mean)[kSegment],
                                                      const OutputPlace& at, int h, int blk, int S, int H, bool whole,
                                                      std::uint8_t* codes, float* scales, int* nonfinite,
                                                      std::uint8_t* transposed, std::uint32_t (&warp_max)[kCtaWarps],
                                                      std::uint32_t* tile,
                                                      std::uint32_t (&words)[kMaxItems][kQuadTokens][2]) {
  const int s0 = blk * kTokenBlock;
  std::uint32_t mag = 0;
  if (smoothed) {
    // fl(x − m) is monotone in x, so a channel's largest |fl(x − m)| sits at
    // its largest or smallest x. NaN is not ordered by max / min: smoothed K
    // has passed the statistics kernel, which reports it.
    float hi[kSegment], lo[kSegment];
#pragma unroll
    for (int e = 0; e < kSegment; ++e) hi[e] = -INFINITY, lo[e] = INFINITY;
#pragma unroll
    for (int r = 0; r < kMaxItems; ++r)
#pragma unroll
      for (int i = 0; i < kQuadTokens; ++i)
        if (whole || item_token(items, r, i, s0, S) >= 0)
#pragma unroll
          for (int e = 0; e < kSegment; ++e) {
            const float v = element(c.seg[r][i], e);
            hi[e] = fmaxf(hi[e], v), lo[e] = fminf(lo[e], v);
          }
#pragma unroll
    for (int e = 0; e < kSegment; ++e)
      if (hi[e] >= lo[e])  // the thread saw this channel
        mag = max(mag, max(magnitude_bits(hi[e] - mean[e]), magnitude_bits(lo[e] - mean[e])));
  } else {
    mag = segments_magnitude(c);  // elements past the tensor are zeros
  }
  const std::uint32_t amax_bits = block_max(mag, warp_max);
  if (amax_bits >= kInfBits && threadIdx.x == 0) *nonfinite = 1;
  const float scale = fp8_scale_of(__uint_as_float(amax_bits));
  if (threadIdx.x == 0)
    scales[(static_cast<std::int64_t>(at.b) * H + h) * at.blocks + at.row0 / kTokenBlock + blk] = scale;

  const E4M3Divisor div = make_divisor(scale);
  // The FMA-corrected quotient when the block's scale allows it (every
  // realistic block); otherwise the bracket, where a word whose bracket
  // straddles a rounding boundary takes the division.
  const auto x = [&](int r, int i, int e) { return element(c.seg[r][i], e) - mean[e]; };
  const auto each_word = [&](auto code_of) {
#pragma unroll
    for (int r = 0; r < kMaxItems; ++r)
#pragma unroll
      for (int i = 0; i < kQuadTokens; ++i)
#pragma unroll
        for (int w = 0; w < 2; ++w) {
          const int e = 4 * w;
          words[r][i][w] = code_of(x(r, i, e), x(r, i, e + 1), x(r, i, e + 2), x(r, i, e + 3));
        }
  };
  if (div.fma_exact) {
    each_word([&](float x0, float x1, float x2, float x3) { return e4m3x4_fma(x0, x1, x2, x3, div); });
  } else {
    each_word([&](float x0, float x1, float x2, float x3) {
      const E4M3Bracket br = e4m3x4_bracket(x0, x1, x2, x3, div);
      return br.shrunk != br.grown ? e4m3x4_divided(x0, x1, x2, x3, div) : br.shrunk;
    });
  }

  // Codes are (B, S, H, D) rows code_pitch bytes apart: one token further is H · code_pitch bytes.
  // Rows past the entry's S but inside the layout (packed sequences: up to the block's end) get zero
  // codes: the backward's dP = dO·Vᵀ reads them, where a masked P of 0 cannot cancel a NaN of stale bytes.
  std::uint8_t* first =
      codes + ((static_cast<std::int64_t>(at.b) * at.rows + at.row0 + s0) * H + h) * job.code_pitch + items.first_d;
  const std::int64_t token_bytes = static_cast<std::int64_t>(H) * job.code_pitch;
#pragma unroll
  for (int r = 0; r < kMaxItems; ++r) {
    std::uint8_t* row = first + items.base[r] * token_bytes;
#pragma unroll
    for (int i = 0; i < kQuadTokens; ++i) {
      const int s = s0 + items.base[r] + quad_offset(i);
      if (items.present && (whole || s < at.rows)) {
        const bool inside = whole || s < S;
        __stcs(reinterpret_cast<uint2*>(row + quad_offset(i) * token_bytes),
               inside ? make_uint2(words[r][i][0], words[r][i][1]) : make_uint2(0u, 0u));
      }
    }
  }
  if (transposed != nullptr) {
    const std::int64_t pitch = static_cast<std::int64_t>(at.blocks) * kTokenBlock;
    store_transposed_codes(items, whole, s0, S, words, tile,
                           transposed + (static_cast<std::int64_t>(at.b) * H + h) * job.D * pitch + at.row0 + s0,
                           pitch);
  }
  return scale;
}

// The quantize kernel is a programmatic dependent launch of the finalize
// kernel: its CTAs may start while the finalize kernel (and, before it, the
// statistics kernel) still runs. A CTA loads its block, which is input only,
// then waits here before it reads k_mean or v_scale or writes anything.
__device__ __forceinline__ void statistics_ready() { cudaGridDependencySynchronize(); }

// K block: (k − mean when smooth_k) → codes and block scale.
template <bool kBackwardOperands, int kCtaWarps, class T>
__device__ __forceinline__ void k_block(const Job<T>& job, const ThreadItems& items, int b, int h, int blk,
                                        std::uint32_t (&warp_max)[kCtaWarps], std::uint32_t* tile) {
  const int j = b * job.Hkv + h;
  const int s0 = blk * kTokenBlock, tokens = job.k_tokens(b);
  if (s0 >= tokens) return;  // past a packed sequence: the forward never reads the block
  const bool whole = whole_block(job.k, s0, tokens);
  Block<T> c;
  load_block<L2Reuse::last>(items, job.k, b, h, s0, tokens, whole, c);
  statistics_ready();
  float mean[kSegment] = {};
  if (job.smooth_k && items.present)
    load_channels(job.out.k_mean + static_cast<std::int64_t>(j) * job.D + items.first_d, mean);
  std::uint32_t words[kMaxItems][kQuadTokens][2];
  quantize_token_block(job, items, c, job.smooth_k, mean, job.k_place(b), h, blk, tokens, job.Hkv, whole, job.out.k, job.out.k_scale, job.out.nonfinite + kK, kBackwardOperands ? job.out.kt : nullptr,
                       warp_max, tile, words);
}

// V block: codes of v / scale[d], staged as Vᵀ words (a quad's four keys of
// one channel) and written out one 128-key row per channel.
template <bool kPaddedLanes, class T>
__device__ __forceinline__ void v_block(const Job<T>& job, const ThreadItems& items, int b, int h, int blk,
                                        std::uint32_t* tile) {
  const int j = b * job.Hkv + h;
  const int s0 = blk * kTokenBlock, tokens = job.k_tokens(b);
  if (s0 >= tokens) return;  // past a packed sequence: the forward never reads the block
  const bool whole = whole_block(job.v, s0, tokens);
  Block<T> c;
  load_block<L2Reuse::last>(items, job.v, b, h, s0, tokens, whole, c);
  statistics_ready();
  float scale[kSegment];
  if (items.present) {
    load_channels(job.out.v_scale + static_cast<std::int64_t>(j) * job.D + items.first_d, scale);
  } else {
#pragma unroll
    for (int e = 0; e < kSegment; ++e) scale[e] = 1.0f;  // a padded lane: zeros code to 0, rows not stored
  }
  // Per channel only the scale and its reciprocal stay live; the bracket's
  // two factors are made in the rare branch that needs them.
  float recip[kSegment];
#pragma unroll
  for (int e = 0; e < kSegment; ++e) recip[e] = __frcp_rn(scale[e]);
  // Keys past Sk hold zeros, whose code is 0. One item (a quad of keys × 8
  // channels) at a time, so that only its 8 words are live.
  const int g = items.column;
#pragma unroll
  for (int r = 0; r < kMaxItems; ++r) {
    const int q = items.quad[r];
    const Segment<T>(&x)[kQuadTokens] = c.seg[r];
    std::uint32_t words[kSegment];
#pragma unroll
    for (int e = 0; e < kSegment; ++e) {
      const float x0 = element(x[0], e), x1 = element(x[1], e), x2 = element(x[2], e), x3 = element(x[3], e);
      if (fma_quotient_exact_for(scale[e])) {
        words[e] = e4m3x2(fma_quotient(x0, scale[e], recip[e]), fma_quotient(x1, scale[e], recip[e])) |
                   e4m3x2(fma_quotient(x2, scale[e], recip[e]), fma_quotient(x3, scale[e], recip[e])) << 16;
      } else {
        const E4M3Divisor div = make_divisor(scale[e]);
        const E4M3Bracket br = e4m3x4_bracket(x0, x1, x2, x3, div);
        words[e] = br.shrunk != br.grown ? e4m3x4_divided(x0, x1, x2, x3, div) : br.shrunk;
      }
    }
#pragma unroll
    for (int e = 0; e < kSegment; ++e) tile[(kSegment * g + e) * kVtPitchWords + q] = words[e];
  }
  __syncthreads();
  // Each channel's 128 keys are a 128-byte run of its Vᵀ row.
  const OutputPlace at = job.k_place(b);
  store_transposed_block<kPaddedLanes>(tile,
                                       job.out.vt +
                                           (static_cast<std::int64_t>(at.b) * job.Hkv + h) * job.D * job.out.vt_keys +
                                           at.row0 + blk * kTokenBlock,
                                       job.out.vt_keys, job.D);
}

// Sum over the D / 8 consecutive lanes that hold one token's segments (one
// shuffle level for all of a thread's tokens at a time): at most four levels
// on the common instances' lanes, five on the wide one's (a whole warp).
template <int kLanes>
__device__ __forceinline__ void sum_over_token_lanes(int seg_shift, float (&x)[kMaxItems][kQuadTokens]) {
  constexpr int kLevels = std::countr_zero(static_cast<unsigned>(kLanes / kSegment));
  static_assert(kLanes / kSegment == 1 << kLevels && kLanes / kSegment <= kWarpSize, "a token's lanes in one warp");
#pragma unroll
  for (int level = 0; level < kLevels; ++level) {
    if ((2 << level) > (1 << seg_shift)) break;
#pragma unroll
    for (int r = 0; r < kMaxItems; ++r)
#pragma unroll
      for (int i = 0; i < kQuadTokens; ++i) x[r][i] += __shfl_xor_sync(kFullWarp, x[r][i], 1 << level);
  }
}

// QRowDot: Σ_d q·with per token of the block, for every token below the
// block's end (q and `with` read as zeros past the entry's `tokens`, so
// those rows get 0). `with` is loaded an item at a time, beside the q block
// already held.
template <class T>
__device__ __forceinline__ void q_row_dot(const Job<T>& job, const ThreadItems& items, const Block<T>& c, int b, int h,
                                          int s0, int tokens) {
  const bool whole = whole_block(job.dot_with, s0, tokens);
  const T* first = job.dot_with.segment(b, s0, h, items.first_d);
  float dot[kMaxItems][kQuadTokens];
#pragma unroll
  for (int r = 0; r < kMaxItems; ++r) {
    Segment<T> w[kQuadTokens];
    load_item<L2Reuse::last>(items, job.dot_with, first, r, s0, tokens, whole, w);
#pragma unroll
    for (int i = 0; i < kQuadTokens; ++i) {
      dot[r][i] = 0.0f;
#pragma unroll
      for (int e = 0; e < kSegment; ++e) dot[r][i] = fmaf(element(c.seg[r][i], e), element(w[i], e), dot[r][i]);
    }
  }
  sum_over_token_lanes<kMaxHeadDim>(job.seg_shift, dot);
  if (items.column != 0) return;
  const OutputPlace at = job.q_place(b);
  float* out = job.dot_out + (static_cast<std::int64_t>(at.b) * job.Hq + h) * job.dot_pitch + at.row0 + s0;
#pragma unroll
  for (int r = 0; r < kMaxItems; ++r)
#pragma unroll
    for (int i = 0; i < kQuadTokens; ++i) out[items.base[r] + quad_offset(i)] = dot[r][i];
}

// Q block: codes and block scale; with smooth_k also the LSE correction
// softmax_scale · Σ_d q_deq[d] · k_mean[d] of each token.
template <bool kBackwardOperands, int kLanes, int kCtaWarps, class T>
__device__ __forceinline__ void q_block(const Job<T>& job, const ThreadItems& items, int b, int h, int kv_head,
                                        int blk, std::uint32_t (&warp_max)[kCtaWarps], std::uint32_t* tile) {
  const int s0 = blk * kTokenBlock, tokens = job.q_tokens(b);
  if (s0 >= tokens) return;  // past a packed sequence: the forward never reads the block
  const bool whole = whole_block(job.q, s0, tokens);
  Block<T> c;
  load_block<L2Reuse::last>(items, job.q, b, h, s0, tokens, whole, c);
  statistics_ready();
  // Before the codes, so that nothing but the block is live across it.
  if (kBackwardOperands && job.dot_out != nullptr) q_row_dot(job, items, c, b, h, s0, tokens);
  float mean[kSegment] = {};
  if (job.smooth_k && items.present) {
    const int j = b * job.Hkv + kv_head;
    load_channels(job.out.k_mean + static_cast<std::int64_t>(j) * job.D + items.first_d, mean);
  }
  const float zero[kSegment] = {};
  std::uint32_t words[kMaxItems][kQuadTokens][2];
  const OutputPlace at = job.q_place(b);
  const float scale = quantize_token_block(job, items, c, false, zero, at, h, blk, tokens, job.Hq, whole, job.out.q, job.out.q_scale, job.out.nonfinite + kQ,
                                           kBackwardOperands ? job.out.qt : nullptr, warp_max, tile, words);
  if (!job.smooth_k) return;
  // Σ code·mean over the thread's channels for each of its tokens, then the
  // sum over the D / 8 consecutive lanes of each token (one shuffle level
  // for all tokens at a time), the block scale applied once per token.
  float dot[kMaxItems][kQuadTokens];
#pragma unroll
  for (int r = 0; r < kMaxItems; ++r)
#pragma unroll
    for (int i = 0; i < kQuadTokens; ++i) {
      dot[r][i] = 0.0f;
#pragma unroll
      for (int p = 0; p < kSegment / 2; ++p) {
        const std::uint32_t pair = (words[r][i][p / 2] >> (16 * (p % 2))) & 0xFFFFu;
        const float2 qd = __half22float2(
            __half2(__nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(pair), __NV_E4M3)));
        dot[r][i] = fmaf(qd.x, mean[2 * p], dot[r][i]);
        dot[r][i] = fmaf(qd.y, mean[2 * p + 1], dot[r][i]);
      }
    }
  sum_over_token_lanes<kLanes>(job.seg_shift, dot);
  if (items.column != 0) return;
#pragma unroll
  for (int r = 0; r < kMaxItems; ++r)
#pragma unroll
    for (int i = 0; i < kQuadTokens; ++i) {
      const int s = item_token(items, r, i, s0, tokens);
      if (s >= 0)
        job.out.lse_shift[(static_cast<std::int64_t>(at.b) * job.Hq + h) * at.rows + at.row0 + s] =
            job.softmax_scale * (scale * dot[r][i]);
    }
}

// ---- fp8_quantize_kernel ----------------------------------------------------------------
// Blocks in launch order: first those of the tensors the statistics kernel
// read, in the reverse of its order ((b, chunk, h) descending; with smooth_k
// K, which it read last, then V), then unsmoothed K (same order) and Q.
// A V-only call has no K or Q blocks, a call without V no V blocks.
// kBackwardOperands: the backward's extra outputs (Qᵀ, Kᵀ, the row dot) are
// compiled in; the forward's calls run the instantiation without them (with
// them their quantize kernel measured 1.4–2.7 % slower).
// kPaddedLanes: D is a multiple of kSegment but no power of two (48, 80, 96,
// 112); the CTA has the lanes of the next power of two (job.seg_shift), and
// lanes whose channels lie past D read zeros and write nothing, so that a
// token's lanes still sit in one warp for the shuffles. The forward's
// operands only (the host refuses the backward's).
// kLanes: the widest lane layout of the instance, kMaxHeadDim, or
// kWideHeadDim for D above it (512 threads; padded lanes for D < 256).
template <class T, bool kBackwardOperands, bool kPaddedLanes = false, int kLanes = kMaxHeadDim>
__global__ void __launch_bounds__(quantize_threads(kLanes), kQuantizeCtasFor<T, kLanes>)
    fp8_quantize_kernel(const __grid_constant__ Job<T> job) {
  static_assert(!(kBackwardOperands && kPaddedLanes), "the backward's operands take powers of two");
  static_assert(kLanes == kMaxHeadDim || (kLanes == kWideHeadDim && !kBackwardOperands && kPaddedLanes),
                "the wide instance codes the forward's operands of any D above kMaxHeadDim");
  __shared__ std::uint32_t warp_max[quantize_threads(kLanes) / kWarpSize];
  __shared__ std::uint32_t vt_tile[kLanes * kVtPitchWords];
  const ThreadItems items = thread_items<kPaddedLanes>(job);
  const int kv_blocks = job.B * job.Hkv * job.k_blocks;
  std::uint32_t u = blockIdx.x;
  // K and V: the reverse of the statistics kernel's (b, chunk, h) order.
  const auto kv_place = [&](std::uint32_t v, int& b, int& h, int& blk) {
    const std::uint32_t lin = static_cast<std::uint32_t>(kv_blocks) - 1 - v;
    const std::uint32_t rest = job.by_hkv.quotient(lin), batch = job.by_k_blocks.quotient(rest);
    h = static_cast<int>(job.by_hkv.remainder(lin, rest));
    blk = static_cast<int>(job.by_k_blocks.remainder(rest, batch)), b = static_cast<int>(batch);
  };
  int b, h, blk;
  if (job.smooth_k) {
    if (u < static_cast<std::uint32_t>(kv_blocks)) {
      kv_place(u, b, h, blk);
      k_block<kBackwardOperands>(job, items, b, h, blk, warp_max, vt_tile);
      return;
    }
    u -= kv_blocks;
  }
  if (job.out.vt != nullptr) {
    if (u < static_cast<std::uint32_t>(kv_blocks)) {
      kv_place(u, b, h, blk);
      v_block<kPaddedLanes>(job, items, b, h, blk, vt_tile);
      return;
    }
    u -= kv_blocks;
  }
  if (!job.smooth_k) {
    if (u < static_cast<std::uint32_t>(kv_blocks)) {
      kv_place(u, b, h, blk);
      k_block<kBackwardOperands>(job, items, b, h, blk, warp_max, vt_tile);
      return;
    }
    u -= kv_blocks;
  }
  const std::uint32_t bh = job.by_q_blocks.quotient(u), bq = job.by_hq.quotient(bh);
  h = static_cast<int>(job.by_hq.remainder(bh, bq));
  q_block<kBackwardOperands, kLanes>(job, items, static_cast<int>(bq), h, static_cast<int>(job.by_group.quotient(h)),
          static_cast<int>(job.by_q_blocks.remainder(u, bh)), warp_max, vt_tile);
}

}  // namespace fp4attn::cuda_quantize
