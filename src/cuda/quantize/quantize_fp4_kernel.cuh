// Kernels of the FP4 quantizer (quantize_fp4.hpp). Each arithmetic step is
// the CPU quantizer's (src/formats/quantize.cpp) in IEEE fp32 / fp64, so
// codes, scales, S_enc and the smooth_k mean agree bit for bit:
//   amax       max |x| per block, taken on the float bits (order-free; Inf and
//              NaN come out as the largest magnitudes and are reported)
//   MX scale   fp4attn::mx_scale_code on the bits of amax
//   MX code    E2M1 of x · 2^-k (exact product); for bf16 / fp16 input
//              without smooth_k two at a time in the input's own packed
//              arithmetic (e2m1_pairs.cuh), else one at a time in fp32
//   NV S_enc   min(2688 / amax_tensor, FLT_MAX), 1 when the amax is 0
//   NV scale   UE4M3 of (amax · S_enc) / 6; code E2M1 of (x · S_enc) / scale
//   mean       sequence_mean's order: a double sum per 128-token chunk, the
//              chunk sums added in ascending order, / S in double, to float
// The per-element and per-block rules are in fp4_codes.cuh.
//
// Kernels, 256-thread CTAs (q, k and v CTAs ordered heads fastest, see
// tile_of):
//   fp4_rows_stream_kernel  q, k of 16-bit data in a 16-byte aligned
//                       layout, D ≥ 32 (MXFP4 or NVFP4, smooth_k or not):
//                       persistent, every warp a pipeline of TMA bulk copies
//                       into its own shared-memory slots, a lane per 32
//                       elements (one MX block, two NV blocks)
//   fp4_rows_kernel     q, k otherwise: a CTA quantizes 1024 segments (8
//                       elements of one row) of one (b, h) slice; the lanes of
//                       one scale block are neighbours and share the block's
//                       amax by shuffles
//   fp4_columns_kernel  v: a CTA stages a (16384 / D tokens) × D tile in
//                       shared memory; thread (d, strip) then walks 64 tokens
//                       of channel d, two 32-token runs, each one MX block or
//                       two NV blocks, and writes 16 bytes of a Vᵀ row
//   fp4_columns_stream_kernel  V of 16-bit data in a 16-byte aligned layout,
//                       D = 64 or 128: persistent 256-thread CTAs, three
//                       tile buffers (the next two tiles' copies in flight),
//                       a thread per 32-token run of two neighbouring
//                       channels; Vᵀ rows stored from the runs, untransposed
//                       V rows through a shared code stage
//   fp4_amax_kernel     NVFP4: the tensor's amax (atomicMax on float bits)
//   fp4_mean_*          smooth_k: chunk sums (and, for NVFP4, each chunk's
//                       per-channel max and min), then the mean per channel
#pragma once

#include <cuda_fp8.h>

#include <cuda/ptx>

#include <cfloat>
#include <cstdint>
#include <type_traits>

#include "cuda/quantize/e2m1_pairs.cuh"
#include "cuda/quantize/fp4_codes.cuh"
#include "cuda/quantize/quantize_fp4.hpp"
#include "cuda/quantize/segment.cuh"
#include "fp4attn/formats.hpp"
#include "fp4attn/quantize.hpp"

namespace fp4attn::cuda_quantize::fp4 {

inline constexpr int kThreads = 256;
inline constexpr int kWarpSize = 32;
inline constexpr int kWarps = kThreads / kWarpSize;
inline constexpr std::uint32_t kFullWarp = 0xFFFFFFFFu;
inline constexpr std::uint32_t kInfBits = 0x7F800000u;  // |x| bits at or above this: Inf or NaN
inline constexpr int kRowItems = 4;                      // segments a thread of fp4_rows_kernel owns
inline constexpr int kRowTileSegments = kRowItems * kThreads;
inline constexpr int kColumnTileElems = 16384;           // elements of one fp4_columns_kernel tile
inline constexpr int kStripTokens = 64;                  // tokens of one channel a thread walks
inline constexpr int kRunTokens = 32;                    // one MX block, two NV blocks, 16 bytes of codes
inline constexpr int kColumnItems = kColumnTileElems / kSegment / kThreads;
inline constexpr int kAmaxItems = 4;
// CTAs per SM the register budget must allow: enough loads in flight per SM
// (64 KiB of 16-byte loads for the rows kernel at 16-bit inputs, 96 KiB of
// staged tiles for the columns kernel).
// fp32 data takes twice the registers of 16-bit data: one CTA fewer.
template <class T>
inline constexpr int kRowCtasPerSm = sizeof(T) == 2 ? 4 : 3;
inline constexpr int kColumnCtasPerSm = 3;
// fp4_columns_stream_kernel: channels and tokens of a tile, tile buffers per
// CTA (tiles in flight while one is coded: kStreamBuffers − 1), CTAs per SM
// (the buffers' shared memory) and threads per CTA (a lane per 32-token run
// and channel pair). Tiles of 64 channels read 128 bytes of each token row:
// −9 % against 32 channels (64 bytes a row, four 128-thread CTAs with three
// 16 KiB buffers), with the same 192 KiB of buffers per SM (perf log
// fp4-q26).
inline constexpr int kStreamChannels = 64;
inline constexpr int kStreamTileTokens = 256;
inline constexpr int kStreamTileElems = kStreamTileTokens * kStreamChannels;
inline constexpr int kStreamBuffers = 3;
inline constexpr int kStreamCtasPerSm = 2;
inline constexpr int kStreamThreads = kStreamTileTokens / 32 * kStreamChannels / 2;
inline constexpr int kMeanSumBatch = 16;                 // tokens read ahead of the double-add chains
inline constexpr int kMeanThreads = 128;                 // quads per fp4_mean_partial_kernel CTA
// A register budget (128 per thread) for the mean pass: without it ptxas
// used 48 registers and placed each token's load just before its adds, one
// load in flight per thread; with it the batch's 16 loads issue together
// (perf log fp4-q11: 4 CTAs per SM measured at least as fast as 6; 8 spilled
// with the batch widened to floats at its load, and with the batch held as
// loaded, which fits 64 registers, measured −2 to +3 %: perf log q10).
inline constexpr int kMeanCtasPerSm = 4;

// Scale blocks along the sequence as shifts (the Vᵀ stream kernel's scale rows).
inline constexpr int kMxfp4BlockShift = 5, kNvfp4BlockShift = 4;
static_assert(1 << kMxfp4BlockShift == kMxfp4Block && 1 << kNvfp4BlockShift == kNvfp4Block);

static_assert(kColumnTileElems / kStripTokens == kThreads, "one strip per thread");
static_assert(kStripTokens % kRunTokens == 0 && kRunTokens == kMxfp4Block && kRunTokens == 2 * kNvfp4Block);
static_assert(kRunTokens == kFp4TokenPad, "V's padding keeps every run inside a row");

// Device-side scratch (layout in quantize_fp4.cu).
struct Workspace {
  unsigned* amax;      // NVFP4: tensor amax as float bits
  double* k_partial;   // smooth_k: (B, chunks, H·D) double chunk sums
  float* k_max;        // smooth_k with NVFP4: (B, chunks, H·D) chunk max and min of k
  float* k_min;
};

template <class T>
struct Job {
  InputView<T> in;
  int S, H, D;
  int seg_shift;        // log2(D / 8)
  int tiles_per_slice;  // CTAs per (b, h) slice
  int padded_tokens;    // S_pad (v)
  bool nvfp4, round_up, v_transposed, reverse;
  std::uint8_t* codes;
  std::uint8_t* scales;
  float* tensor_scale;   // NVFP4: written by CTA 0
  const float* mean;     // (B, H, D) or null
  const unsigned* amax;  // NVFP4 tensor amax bits
  int* nonfinite;
};

// ---- reductions ---------------------------------------------------------------

// Max of v over the CTA into *target (atomicMax on float bits); `scratch` holds kWarps words.
__device__ __forceinline__ void cta_max_to(std::uint32_t v, unsigned* scratch, unsigned* target) {
  v = __reduce_max_sync(kFullWarp, v);
  if (threadIdx.x % kWarpSize == 0) scratch[threadIdx.x / kWarpSize] = v;
  __syncthreads();
  if (threadIdx.x == 0) {
    std::uint32_t m = scratch[0];
#pragma unroll
    for (int w = 1; w < kWarps; ++w) m = max(m, scratch[w]);
    atomicMax(target, m);
  }
}

template <class T>
__device__ __forceinline__ float tensor_scale_of(const Job<T>& job, unsigned cta) {
  if (!job.nvfp4) return 1.0f;
  const float s_enc = nv_tensor_scale(__ldcg(job.amax));
  if (cta == 0 && threadIdx.x == 0) *job.tensor_scale = s_enc;
  return s_enc;
}

// ---- q, k: blocks along D -------------------------------------------------------

// CTA → (b, h, token tile), heads fastest: the CTAs running at one time
// cover every head of the same tokens, so together they read whole
// (b, s) rows of the (B, S, H, D) input rather than one head's 2·D bytes out
// of every H·D·2 (a DRAM page per few hundred bytes).
template <class T>
__device__ __forceinline__ void tile_of(const Job<T>& job, unsigned cta, int& b, int& h, int& tile) {
  h = static_cast<int>(cta % job.H);
  const unsigned rest = cta / job.H;
  tile = static_cast<int>(rest % job.tiles_per_slice);
  b = static_cast<int>(rest / job.tiles_per_slice);
}

template <class T>
__global__ void __launch_bounds__(kThreads, kRowCtasPerSm<T>) fp4_rows_kernel(const __grid_constant__ Job<T> job) {
  const unsigned cta = job.reverse ? gridDim.x - 1 - blockIdx.x : blockIdx.x;
  int b, h, tile;
  tile_of(job, cta, b, h, tile);
  const int slice = b * job.H + h;
  const int g = static_cast<int>(threadIdx.x) & ((1 << job.seg_shift) - 1);  // same segment column for every item
  const int first_d = kSegment * g;

  // Item r is the segment at tile · kRowTileSegments + r · kThreads + threadIdx.x.
  const int first_token = (tile * kRowTileSegments + static_cast<int>(threadIdx.x)) >> job.seg_shift;
  const int token_step = kThreads >> job.seg_shift;
  Segment<T> x[kRowItems];
  // Two whole loops on the uniform layout flag: with the flag inside one loop
  // the compiler issued both the 16-byte and the element-wise loads of every
  // segment, predicated.
  if (job.in.vector_loads) {
#pragma unroll
    for (int r = 0; r < kRowItems; ++r) {
      const int token = first_token + r * token_step;
      if (token < job.S) load_segment<L2Reuse::last>(job.in.segment(b, token, h, first_d), true, x[r]);
      else zero_segment(x[r]);
    }
  } else {
#pragma unroll
    for (int r = 0; r < kRowItems; ++r) {
      const int token = first_token + r * token_step;
      if (token < job.S) load_segment<L2Reuse::last>(job.in.segment(b, token, h, first_d), false, x[r]);
      else zero_segment(x[r]);
    }
  }
  __shared__ NvDivisorTable divisors;
  if (job.nvfp4) {  // while the loads are in flight
    divisors.fill(static_cast<int>(threadIdx.x), kThreads);
    __syncthreads();
  }
  float mean[kSegment] = {};
  if (job.mean != nullptr)
#pragma unroll
    for (int e = 0; e < kSegment; ++e) mean[e] = __ldg(job.mean + static_cast<std::int64_t>(slice) * job.D + first_d + e);
  const float s_enc = tensor_scale_of(job, cta);

  // Segments per scale block and blocks per row as shifts: as divisions by
  // runtime values they were signed division sequences in every item.
  static_assert(kNvfp4Block == 2 * kSegment && kMxfp4Block == 4 * kSegment, "scale blocks of 2 or 4 segments");
  const int block_shift = job.nvfp4 ? 1 : 2;  // log2(segments per scale block)
  const int segs_per_block = 1 << block_shift;
  const int blocks_per_row = (1 << job.seg_shift) >> block_shift;
  // MXFP4 of unsmoothed 16-bit data: two elements per instruction (e2m1_pairs.cuh).
  const bool pairs = sizeof(T) == 2 && !job.nvfp4 && job.mean == nullptr;
  bool bad = false;
#pragma unroll
  for (int r = 0; r < kRowItems; ++r) {
    float v[kSegment];
    std::uint32_t mag = 0;
    if constexpr (sizeof(T) == 2)
      if (pairs) mag = pairs_amax_bits<T>(x[r].w);
    if (!pairs) {
#pragma unroll
      for (int e = 0; e < kSegment; ++e) {
        v[e] = element(x[r], e);
        if (job.mean != nullptr) v[e] = __fsub_rn(v[e], mean[e]);
        mag = max(mag, magnitude_bits(v[e]));
      }
    }
    // The block's segments sit in neighbouring lanes.
    for (int off = 1; off < segs_per_block; off *= 2) mag = max(mag, __shfl_xor_sync(kFullWarp, mag, off));
    bad |= mag >= kInfBits;
    std::uint32_t scale_code, word = 0;
    if (job.nvfp4) {
      scale_code = nv_scale_code(__uint_as_float(mag), s_enc);
      nv_codes<kSegment>(v, 0, s_enc, divisors[scale_code], &word);
    } else {
      scale_code = mx_scale_code(mag, job.round_up);
      bool done = false;
      if constexpr (sizeof(T) == 2) {
        if (pairs && mx_pairs_apply<T>(scale_code)) {
          std::uint32_t p[kSegment / 2];
          segment_pairs(x[r].w, p);
          word = mx_codes_x8<T>(p, mx_pair_scale<T>(scale_code));
          done = true;
        } else if (pairs) {
#pragma unroll
          for (int e = 0; e < kSegment; ++e) v[e] = element(x[r], e);
        }
      }
      if (!done) {
        const float inv = exp2i(kE8M0Bias - static_cast<int>(scale_code));  // 2^-k: the product is exact
#pragma unroll
        for (int e = 0; e < kSegment; ++e) word |= e2m1_code(__fmul_rn(v[e], inv)) << (4 * e);
      }
    }
    const int token = first_token + r * token_step;
    if (token < job.S) {
      const std::int64_t row = static_cast<std::int64_t>(slice) * job.S + token;
      __stcs(reinterpret_cast<unsigned*>(job.codes + row * (job.D / 2) + first_d / 2), word);
      if ((g & (segs_per_block - 1)) == 0)
        job.scales[row * blocks_per_row + (g >> block_shift)] = static_cast<std::uint8_t>(scale_code);
    }
  }
  if (bad) *job.nonfinite = 1;
}

// ---- fp32 blocks through the packed encoder (e2m1_codes_x8_fp32) ----------------

// The NVFP4 block of v at `first` (a multiple of 16): codes of fl(fl(x · S_enc)
// / s_b) into its two words. A zero scale leaves them at +0, as the CPU
// writes them (the quotients of negative elements would be −0).
template <int N>
__device__ __forceinline__ void nv_block_codes(const float (&v)[N], int first, float s_enc, const NvDivisor& div,
                                               std::uint32_t* words) {
  static_assert(kNvfp4Block == 2 * kSegment, "an NVFP4 block is two words of codes");
  if (div.r_hi == 0.0f) return;
#pragma unroll
  for (int g = first / kSegment; g < first / kSegment + 2; ++g)
    words[g] = e2m1_codes_x8_fp32([&](int e) { return nv_quotient(v[kSegment * g + e], s_enc, div); });
}

// The MX block's codes of v[0 .. 32) scaled by inv = 2^-k (exact products).
__device__ __forceinline__ void mx_block_codes_fp32(const float (&v)[kMxfp4Block], float inv,
                                                    std::uint32_t (&words)[kMxfp4Block / kSegment]) {
#pragma unroll
  for (int g = 0; g < kMxfp4Block / kSegment; ++g)
    words[g] = e2m1_codes_x8_fp32([&](int e) { return __fmul_rn(v[kSegment * g + e], inv); });
}

// ---- v: blocks along the sequence ------------------------------------------------

// Codes of 32 consecutive tokens of one channel (one MX block, two NV
// blocks) into four words, token t at nibble t of the run; the scale codes of
// the run's blocks go to scales[0], scales[pitch]; NVFP4's divisors from
// `divisors` (unused for MX). Returns the run's largest |v| as float bits
// (Inf and NaN above every finite value). `block_mag`, when given, holds
// each block's largest |v| as float bits, computed by the caller.
template <bool kNv>
__device__ __forceinline__ std::uint32_t encode_run(const float (&v)[kRunTokens], bool round_up, float s_enc,
                                                    std::uint32_t (&words)[kRunTokens / kSegment],
                                                    std::uint8_t* scales, int pitch,
                                                    const NvDivisorTable* divisors,
                                                    const std::uint32_t* block_mag = nullptr) {
  constexpr int kBlock = kNv ? kNvfp4Block : kMxfp4Block;
  std::uint32_t run_mag = 0;
#pragma unroll
  for (int k = 0; k < kRunTokens / kBlock; ++k) {
    std::uint32_t mag = 0;
    if (block_mag != nullptr) {
      mag = block_mag[k];
    } else {
#pragma unroll
      for (int t = k * kBlock; t < (k + 1) * kBlock; ++t) mag = max(mag, magnitude_bits(v[t]));
    }
    run_mag = max(run_mag, mag);
    std::uint32_t scale_code;
    if constexpr (kNv) {
      scale_code = nv_scale_code(__uint_as_float(mag), s_enc);
      nv_block_codes(v, k * kBlock, s_enc, (*divisors)[scale_code], words);
    } else {
      static_assert(kBlock == kRunTokens, "one MX block per run");
      scale_code = mx_scale_code(mag, round_up);
      mx_block_codes_fp32(v, exp2i(kE8M0Bias - static_cast<int>(scale_code)), words);  // 2^-k: exact products
    }
    scales[k * pitch] = static_cast<std::uint8_t>(scale_code);
  }
  return run_mag;
}

// The packed MXFP4 code of one run from its pairs p[4g + j] = tokens
// (8g + j, 8g + j + 4): encode_run_pairs once the run is gathered.
template <class T>
__device__ __forceinline__ bool encode_pairs(const std::uint32_t (&p)[kRunTokens / 2], bool round_up,
                                             std::uint32_t (&words)[kRunTokens / kSegment], std::uint8_t* scale,
                                             std::uint32_t& mag) {
  mag = pairs_amax_bits<T>(p);
  const std::uint32_t scale_code = mx_scale_code(mag, round_up);
  if (!mx_pairs_apply<T>(scale_code)) return false;
  const typename Pairs<T>::H2 factor = mx_pair_scale<T>(scale_code);
#pragma unroll
  for (int g = 0; g < kRunTokens / kSegment; ++g) words[g] = mx_codes_x8<T>(p + 4 * g, factor);
  *scale = static_cast<std::uint8_t>(scale_code);
  return true;
}

// encode_run for MXFP4 of 16-bit data, two tokens per instruction, reading
// the run's 32 tokens of one channel from the staged tile (`column` points
// at the first, `pitch` elements apart); `mag` receives the run's largest
// |x| as float bits. Returns false, writing nothing, when the block's scale
// is outside what the packed path covers.
template <class T>
__device__ __forceinline__ bool encode_run_pairs(const T* column, int pitch, bool round_up,
                                                 std::uint32_t (&words)[kRunTokens / kSegment], std::uint8_t* scale,
                                                 std::uint32_t& mag) {
  static_assert(kRunTokens == kMxfp4Block, "one MX block per run");
  const auto* raw = reinterpret_cast<const unsigned short*>(column);
  std::uint32_t p[kRunTokens / 2];  // p[4g + j] = tokens (8g + j, 8g + j + 4), as mx_codes_x8 takes them
#pragma unroll
  for (int g = 0; g < kRunTokens / kSegment; ++g)
#pragma unroll
    for (int j = 0; j < kSegment / 2; ++j)
      p[4 * g + j] = raw[(kSegment * g + j) * pitch] | static_cast<std::uint32_t>(raw[(kSegment * g + j + 4) * pitch]) << 16;
  return encode_pairs<T>(p, round_up, words, scale, mag);
}

__device__ __forceinline__ float widen(std::uint32_t bits, __nv_bfloat16) { return __uint_as_float(bits << 16); }
__device__ __forceinline__ float widen(std::uint32_t bits, __half) {
  return __half2float(__ushort_as_half(static_cast<unsigned short>(bits)));
}

// column_run from the run's gathered pairs (encode_pairs' order), the scale
// codes `dim` bytes apart; NVFP4's divisors from `divisors`.
template <class T>
__device__ __forceinline__ std::uint32_t run_from_pairs(const Job<T>& job, const std::uint32_t (&p)[kRunTokens / 2],
                                                        int dim, std::uint8_t* scales, float s_enc,
                                                        const NvDivisorTable& divisors,
                                                        std::uint32_t (&words)[kRunTokens / kSegment]) {
#pragma unroll
  for (int w = 0; w < kRunTokens / kSegment; ++w) words[w] = 0;
  std::uint32_t mag = 0;
  if (!job.nvfp4 && encode_pairs<T>(p, job.round_up, words, scales, mag)) return mag;
  float v[kRunTokens];
#pragma unroll
  for (int g = 0; g < kRunTokens / kSegment; ++g)
#pragma unroll
    for (int j = 0; j < kSegment / 2; ++j) {
      v[kSegment * g + j] = widen(p[4 * g + j] & 0xFFFFu, T{});
      v[kSegment * g + j + 4] = widen(p[4 * g + j] >> 16, T{});
    }
  if (job.nvfp4) {
    // Each NV block's amax on the input's own 16-bit magnitudes, two per
    // instruction: block k is tokens 16k .. 16k + 15, the pairs p[8k .. 8k + 7].
    constexpr int kBlockPairs = kNvfp4Block / 2;
    std::uint32_t block_mag[kRunTokens / kNvfp4Block];
#pragma unroll
    for (int k = 0; k < kRunTokens / kNvfp4Block; ++k)
      block_mag[k] = pairs_amax_bits<T>(*reinterpret_cast<const std::uint32_t(*)[kBlockPairs]>(p + kBlockPairs * k));
    return encode_run<true>(v, job.round_up, s_enc, words, scales, dim, &divisors, block_mag);
  }
  return encode_run<false>(v, job.round_up, s_enc, words, scales, dim, nullptr);
}

// The 32-token run of channel d starting at token `first` of a staged tile
// whose rows hold D = `dim` elements: four code words, the run's scale codes
// written to `scales` (D bytes apart). Returns the run's largest |x| as float
// bits. A caller that passes a compile-time dim gets every shared-memory
// address as one register plus an immediate offset.
template <class T>
__device__ __forceinline__ std::uint32_t column_run(const Job<T>& job, const T* tile, int dim, int first, int d,
                                                    std::uint8_t* scales, float s_enc, const NvDivisorTable& divisors,
                                                    std::uint32_t (&words)[kRunTokens / kSegment]) {
#pragma unroll
  for (int w = 0; w < kRunTokens / kSegment; ++w) words[w] = 0;
  std::uint32_t mag = 0;
  if constexpr (sizeof(T) == 2)
    if (!job.nvfp4 && encode_run_pairs<T>(tile + first * dim + d, dim, job.round_up, words, scales, mag))
      return mag;
  float v[kRunTokens];
#pragma unroll
  for (int t = 0; t < kRunTokens; ++t) v[t] = to_float(tile[(first + t) * dim + d]);
  if (job.nvfp4) return encode_run<true>(v, job.round_up, s_enc, words, scales, dim, &divisors);
  return encode_run<false>(v, job.round_up, s_enc, words, scales, dim, nullptr);
}

template <class T>
__global__ void __launch_bounds__(kThreads, kColumnCtasPerSm) fp4_columns_kernel(const __grid_constant__ Job<T> job) {
  extern __shared__ __align__(16) unsigned char smem[];
  T* tile = reinterpret_cast<T*>(smem);
  const unsigned cta = job.reverse ? gridDim.x - 1 - blockIdx.x : blockIdx.x;
  int b, h, tile_index;
  tile_of(job, cta, b, h, tile_index);
  const int slice = b * job.H + h;
  const int tile_tokens = kColumnTileElems / job.D;
  const int t0 = tile_index * tile_tokens;

  // Stage the tile, tokens past S as zeros (code 0, no effect on any amax).
  {
    Segment<T> x[kColumnItems];
    const int g = static_cast<int>(threadIdx.x) & ((1 << job.seg_shift) - 1);
    bool bad = false;
#pragma unroll
    for (int r = 0; r < kColumnItems; ++r) {
      const int s = t0 + ((r * kThreads + static_cast<int>(threadIdx.x)) >> job.seg_shift);
      if (s < job.S) load_segment<L2Reuse::last>(job.in.segment(b, s, h, kSegment * g), job.in.vector_loads, x[r]);
      else zero_segment(x[r]);
    }
#pragma unroll
    for (int r = 0; r < kColumnItems; ++r) {
#pragma unroll
      for (int e = 0; e < kSegment; ++e) bad |= magnitude_bits(element(x[r], e)) >= kInfBits;
      const int tok = (r * kThreads + static_cast<int>(threadIdx.x)) >> job.seg_shift;
      store_segment(tile + tok * job.D + kSegment * g, x[r]);
    }
    if (bad) *job.nonfinite = 1;
  }
  const float s_enc = tensor_scale_of(job, cta);
  __shared__ NvDivisorTable divisors;
  if (job.nvfp4) divisors.fill(static_cast<int>(threadIdx.x), kThreads);
  __syncthreads();

  const int d = static_cast<int>(threadIdx.x) & (job.D - 1);
  const int strip = static_cast<int>(threadIdx.x) / job.D;
  const int block = job.nvfp4 ? kNvfp4Block : kMxfp4Block;
  const int scale_rows = job.padded_tokens / block;
  std::uint8_t* staged = smem + sizeof(T) * kColumnTileElems;  // untransposed: one code per byte, (token, d)
#pragma unroll 1
  for (int run = 0; run < kStripTokens / kRunTokens; ++run) {
    const int first = strip * kStripTokens + run * kRunTokens;  // in the tile
    if (t0 + first >= job.padded_tokens) break;
    std::uint32_t words[kRunTokens / kSegment];
    std::uint8_t* scales = job.scales + (static_cast<std::int64_t>(slice) * scale_rows + (t0 + first) / block) * job.D + d;
    column_run(job, tile, job.D, first, d, scales, s_enc, divisors, words);
    if (job.v_transposed) {
      const std::int64_t row = static_cast<std::int64_t>(slice) * job.D + d;
      __stcs(reinterpret_cast<uint4*>(job.codes + row * (job.padded_tokens / 2) + (t0 + first) / 2),
             make_uint4(words[0], words[1], words[2], words[3]));
    } else {
#pragma unroll
      for (int t = 0; t < kRunTokens; ++t)
        staged[(first + t) * job.D + d] = static_cast<std::uint8_t>((words[t / kSegment] >> (4 * (t % kSegment))) & 0xFu);
    }
  }
  if (job.v_transposed) return;
  // Untransposed: pack channel pairs of each token, 8 codes per store.
  __syncthreads();
  for (int w = static_cast<int>(threadIdx.x); w < kColumnTileElems / kSegment; w += kThreads) {
    const int tok = w >> job.seg_shift, g = w & ((1 << job.seg_shift) - 1);
    if (t0 + tok >= job.padded_tokens) break;
    const uint2 c = *reinterpret_cast<const uint2*>(staged + tok * job.D + kSegment * g);
    std::uint32_t word = 0;
#pragma unroll
    for (int e = 0; e < kSegment; ++e) word |= ((e < 4 ? c.x >> (8 * e) : c.y >> (8 * (e - 4))) & 0xFu) << (4 * e);
    const std::int64_t row = static_cast<std::int64_t>(slice) * job.padded_tokens + t0 + tok;
    __stcs(reinterpret_cast<unsigned*>(job.codes + row * (job.D / 2) + kSegment / 2 * g), word);
  }
}

// Untransposed V from the Vᵀ kernel's runs: a tile's codes are staged as
// one row of kStreamCodeRowBytes per token (byte c: channels 2c, 2c + 1,
// the low nibble the even one), then each thread stores one token's row.
// The lane of run k and channel pair c writes byte c of rows 32k .. 32k + 31;
// word w of row 32k + t sits at w ^ k, so the eight runs of a store
// instruction hit eight banks.
inline constexpr int kStreamCodeRowBytes = kStreamChannels / 2;
inline constexpr int kStreamCodeStageBytes = kStreamTileTokens * kStreamCodeRowBytes;

__device__ __forceinline__ void stage_untransposed(const std::uint32_t (&words)[2][kRunTokens / kSegment],
                                                   unsigned char* stage, int run, int pair) {
  const std::uint32_t base = static_cast<std::uint32_t>(__cvta_generic_to_shared(stage)) +
                             static_cast<std::uint32_t>(kRunTokens * run * kStreamCodeRowBytes + 4 * ((pair / 4) ^ run) +
                                                        pair % 4);
#pragma unroll
  for (int g = 0; g < kRunTokens / kSegment; ++g) {
    // Byte i of even / odd: tokens 8g + 2i / 8g + 2i + 1, channel 2c in the low nibble.
    const std::uint32_t lo = words[0][g], hi = words[1][g];
    const std::uint32_t even = (lo & 0x0F0F0F0Fu) | ((hi & 0x0F0F0F0Fu) << 4);
    const std::uint32_t odd = ((lo >> 4) & 0x0F0F0F0Fu) | (((hi >> 4) & 0x0F0F0F0Fu) << 4);
    const std::uint32_t tokens[2] = {__byte_perm(even, odd, 0x5140), __byte_perm(even, odd, 0x7362)};
#pragma unroll
    for (int t = 0; t < kSegment; ++t)
      asm volatile("st.shared.u8 [%0], %1;" ::"r"(base + (kSegment * g + t) * kStreamCodeRowBytes),
                   "r"((tokens[t / 4] >> (8 * (t % 4))) & 0xFFu)
                   : "memory");
  }
}

// Thread i stores token i of the tile: its kStreamCodeRowBytes codes at the
// tile's channel chunk of the token's (B, H, S_pad, D / 2) row. Row i's
// words sit at w ^ k, k = i / 32 the same for a whole warp: 16-byte chunk c
// is physical chunk c ^ (k >> 2) with its words in the order m ^ (k & 3).
template <class T, class TileAt>
__device__ __forceinline__ void store_untransposed(const unsigned char* stage, const TileAt& at, const Job<T>& job,
                                                   int dim, int chunk_channels) {
  const int i = static_cast<int>(threadIdx.x), k = i / kRunTokens;  // k: the token's run, one per warp
  if (at.t0 + i >= job.padded_tokens) return;
  const std::uint32_t row = static_cast<std::uint32_t>(__cvta_generic_to_shared(stage)) +
                            static_cast<std::uint32_t>(i * kStreamCodeRowBytes);
  const std::int64_t token_row = static_cast<std::int64_t>(at.b * job.H + at.h) * job.padded_tokens + at.t0 + i;
  auto* out = reinterpret_cast<uint4*>(job.codes + token_row * (dim / 2) + at.chunk * (chunk_channels / 2));
#pragma unroll
  for (int c = 0; c < kStreamCodeRowBytes / 16; ++c) {
    std::uint32_t v[4];
    asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v[0]), "=r"(v[1]), "=r"(v[2]), "=r"(v[3])
                 : "r"(row + 16u * static_cast<unsigned>(c ^ (k >> 2))));
    // Logical word m is v[m ^ (k & 3)]: swap within pairs, then the pairs (k is warp-uniform).
    if (k & 1) {
      const std::uint32_t t0 = v[0], t2 = v[2];
      v[0] = v[1], v[1] = t0, v[2] = v[3], v[3] = t2;
    }
    if (k & 2) {
      const std::uint32_t t0 = v[0], t1 = v[1];
      v[0] = v[2], v[1] = v[3], v[2] = t0, v[3] = t1;
    }
    __stcs(out + c, make_uint4(v[0], v[1], v[2], v[3]));
  }
}

// V (Vᵀ, or untransposed) of 16-bit data in a 16-byte aligned layout with
// D = kD (64 or 128), pipelined: persistent CTAs (kStreamCtasPerSm per SM), each walking tiles
// blockIdx.x, blockIdx.x + gridDim.x, … with kStreamBuffers shared-memory tile
// buffers; the next tiles' 16-byte cp.async copies (zero-filled past S) are in
// flight while the CTA codes the current one.
//
// A tile is kStreamTileTokens = 256 tokens × kStreamChannels = 64 channels
// of one (b, h): its codes are whole 128-byte lines of 64 Vᵀ rows (the
// 16-byte code stores of a tile's eight 32-token runs of a channel are one
// line, and the eight lanes that hold them store it in one instruction; perf
// log fp4-q21), and its copies read 128 bytes of each token row (fp4-q26:
// 64-byte pieces, with 32-channel tiles, cost 9 %). Tiles are numbered chunk
// of channels fastest, then heads, then token tiles: the CTAs at work read
// whole rows of a (B, S, H, D) input together.
//
// Lane ℓ of warp w codes run k = ℓ % 8 (tokens 32k .. 32k + 31 of the tile)
// of channels 2p, 2p + 1, p = 4w + ℓ / 8: one 32-bit shared load per token
// gives both, a byte permute splits them. Token 32k + j of the tile sits at
// row 8j + k of the buffer (128 bytes, 64 channels), its 16-byte chunk q at
// q ^ k: the 32 lanes of a load (8 runs × 4 words of one chunk) then hit 32
// different banks. Non-finite input shows in the runs' amax. D is a template
// parameter so that global steps and shared offsets are constants. For
// untransposed V (kTransposed false) the runs' codes go to a shared code
// stage instead and each thread then stores one token's codes
// (stage_untransposed, store_untransposed); an instance of its own, since
// in the Vᵀ kernel the stage's registers and branches cost 1–1.5 % (perf
// log fp4-q28).
template <class T, int kD, bool kTransposed>
__global__ void __launch_bounds__(kStreamThreads, kStreamCtasPerSm) fp4_columns_stream_kernel(
    const __grid_constant__ Job<T> job, int tiles) {
  static_assert(sizeof(T) == 2, "16-byte copies of 8 elements");
  static_assert(kD == 64 || kD == 128, "the head dims with a compile-time tile pitch");
  constexpr int kChunkChannels = kStreamTileElems / kStreamTileTokens;  // 64
  constexpr int kChunks = kD / kChunkChannels;                           // per head
  constexpr int kRowBytes = kChunkChannels * static_cast<int>(sizeof(T));  // 128
  constexpr int kPiecesPerRow = kRowBytes / kVectorBytes;                // 8 copies of 16 bytes
  constexpr int kRuns = kStreamTileTokens / kRunTokens;                  // 8
  static_assert(kRuns == 8 && kPiecesPerRow == 8, "the bank swizzle below assumes 8 runs of 8 chunks");
  static_assert(kD % kChunkChannels == 0, "whole chunks of channels per head");
  static_assert(kStreamThreads == kRuns * kChunkChannels / 2, "a lane per run and channel pair");
  static_assert(kStreamThreads / kPiecesPerRow == kRunTokens, "a copy step is one token of every run");
  extern __shared__ __align__(16) unsigned char smem[];
  unsigned char* const buffers = smem;  // buffer k at buffers + k · kStreamTileBytes
  constexpr int kStreamTileBytes = kStreamTileElems * static_cast<int>(sizeof(T));
  NvDivisorTable& divisors = *reinterpret_cast<NvDivisorTable*>(smem + kStreamBuffers * kStreamTileBytes);
  // Untransposed V: the tile's codes, a row of kStreamCodeRowBytes per token (stage_untransposed).
  unsigned char* const code_stage = smem + kStreamBuffers * kStreamTileBytes + sizeof(NvDivisorTable);
  if (job.nvfp4) divisors.fill(static_cast<int>(threadIdx.x), kStreamThreads);  // read after the loop's first barrier
  // Byte offset of chunk q of token 32k + j of a tile in its buffer.
  const auto at_byte = [](int j, int k, int q) { return (8 * j + k) * kRowBytes + kVectorBytes * (q ^ k); };
  struct TileAt {
    int b, h, chunk, t0;
  };
  const int token_tiles = job.tiles_per_slice;  // token tiles per (b, h)
  const auto place = [&](int walk) {
    const int w = job.reverse ? tiles - 1 - walk : walk;
    TileAt at;
    at.chunk = w % kChunks;
    const int rest = w / kChunks;
    at.h = rest % job.H;
    const int bt = rest / job.H;
    at.t0 = (bt % token_tiles) * kStreamTileTokens;
    at.b = bt / token_tiles;
    return at;
  };
  const auto copy16 = [](unsigned char* dst, const T* src, unsigned bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(
                     static_cast<unsigned>(__cvta_generic_to_shared(dst))),
                 "l"(src), "r"(bytes)
                 : "memory");
  };
  const auto stage = [&](const TileAt& at, unsigned char* dst) {
    // This thread's copies: chunk q of token j of every run k. The thread
    // index is read by a volatile move, which the compiler cannot hoist out
    // of the tile loop (a live offset there was a spilled register once).
    int tid;
    asm volatile("mov.u32 %0, %%tid.x;" : "=r"(tid));
    const int q = tid % kPiecesPerRow, j = tid / kPiecesPerRow;
    const int d0 = at.chunk * kChunkChannels + kSegment * q;
    if (at.t0 + kStreamTileTokens <= job.S) {  // a whole tile: one address, then fixed steps
      const T* src = job.in.segment(at.b, at.t0 + j, at.h, d0);
      const std::int64_t step = kRunTokens * job.in.stride_s;
#pragma unroll
      for (int k = 0; k < kRuns; ++k) copy16(dst + at_byte(j, k, q), src + k * step, kVectorBytes);
    } else {
#pragma unroll
      for (int k = 0; k < kRuns; ++k) {
        const int s = at.t0 + kRunTokens * k + j;
        // Past S: sixteen zero bytes, read from nowhere (the clamped address stays valid).
        copy16(dst + at_byte(j, k, q), job.in.segment(at.b, min(s, job.S - 1), at.h, d0),
               s < job.S ? kVectorBytes : 0u);
      }
    }
    asm volatile("cp.async.commit_group;" ::: "memory");
  };
  const int block_shift = job.nvfp4 ? kNvfp4BlockShift : kMxfp4BlockShift;
  const int scale_rows = job.padded_tokens >> block_shift;
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  const int run = lane % kRuns;
  const int pair = static_cast<int>(threadIdx.x) / kWarpSize * (kWarpSize / kRuns) + lane / kRuns;
  std::uint32_t mag = 0;
  // ahead[k]: the tile of iteration i + k (k < kStreamBuffers − 1 staged).
  TileAt ahead[kStreamBuffers] = {};
  const int stride = static_cast<int>(gridDim.x);
#pragma unroll
  for (int k = 0; k + 1 < kStreamBuffers; ++k) {
    const int w = static_cast<int>(blockIdx.x) + k * stride;
    if (w < tiles) {
      ahead[k] = place(w);
      stage(ahead[k], buffers + k * kStreamTileBytes);
    } else {
      asm volatile("cp.async.commit_group;" ::: "memory");  // empty groups keep the count
    }
  }
  // After NVFP4's amax pass this kernel is a programmatic dependent launch
  // (quantize_fp4.cu): the first tiles' copies (input only) are in flight
  // before it waits for the tensor amax, and before it writes.
  cudaGridDependencySynchronize();
  const float s_enc = tensor_scale_of(job, blockIdx.x);
#pragma unroll 1
  for (int i = 0, walk = static_cast<int>(blockIdx.x); walk < tiles; ++i, walk += stride) {
    // The buffer the furthest tile goes to was last read in iteration i − 1,
    // before the barrier that ended it.
    const int far = walk + (kStreamBuffers - 1) * stride;
    if (far < tiles) {
      ahead[kStreamBuffers - 1] = place(far);
      stage(ahead[kStreamBuffers - 1], buffers + ((i + kStreamBuffers - 1) % kStreamBuffers) * kStreamTileBytes);
    } else {
      asm volatile("cp.async.commit_group;" ::: "memory");
    }
    // This tile's copies have landed once at most kStreamBuffers − 1 newer groups are pending.
    asm volatile("cp.async.wait_group %0;" ::"n"(kStreamBuffers - 1) : "memory");
    __syncthreads();
    const TileAt at = ahead[0];
    const unsigned char* tile = buffers + (i % kStreamBuffers) * kStreamTileBytes;
    const int first = at.t0 + kRunTokens * run;  // the run's first token
    if (first < job.padded_tokens) {
      const int slice = at.b * job.H + at.h;
      // Word pair % 4 of chunk pair / 4 of each token: channels 2 · pair, 2 · pair + 1.
      const auto word = [&](int j) {
        return *reinterpret_cast<const std::uint32_t*>(tile + at_byte(j, run, pair / 4) + 4 * (pair % 4));
      };
      std::uint32_t p[2][kRunTokens / 2];
#pragma unroll
      for (int g = 0; g < kRunTokens / kSegment; ++g)
#pragma unroll
        for (int j = 0; j < kSegment / 2; ++j) {
          const std::uint32_t a = word(kSegment * g + j), b = word(kSegment * g + j + 4);
          p[0][4 * g + j] = __byte_perm(a, b, 0x5410);
          p[1][4 * g + j] = __byte_perm(a, b, 0x7632);
        }
      std::uint32_t words[2][kRunTokens / kSegment];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int d = at.chunk * kChunkChannels + 2 * pair + h;
        mag = max(mag, run_from_pairs(job, p[h], kD,
                                      job.scales + (static_cast<std::int64_t>(slice) * scale_rows +
                                                    (first >> block_shift)) * kD + d,
                                      s_enc, divisors, words[h]));
        if constexpr (kTransposed) {
          // The eight runs' lanes (lane / 8 equal) store one 128-byte line of row d.
          const std::int64_t row = static_cast<std::int64_t>(slice) * kD + d;
          __stcs(reinterpret_cast<uint4*>(job.codes + row * (job.padded_tokens / 2) + first / 2),
                 make_uint4(words[h][0], words[h][1], words[h][2], words[h][3]));
        }
      }
      if constexpr (!kTransposed) stage_untransposed(words, code_stage, run, pair);
    }
    if constexpr (!kTransposed) {
      __syncthreads();  // the tile's codes are staged
      store_untransposed(code_stage, at, job, kD, kChunkChannels);
    }
#pragma unroll
    for (int k = 0; k + 1 < kStreamBuffers; ++k) ahead[k] = ahead[k + 1];
    __syncthreads();
  }
  if (mag >= kInfBits) *job.nonfinite = 1;
}

// ---- 16-bit q and k, pipelined -------------------------------------------------------

// The common case for q and k (bf16 / fp16 rows that start on 16-byte
// boundaries) runs a persistent kernel in which every warp
// is its own pipeline: it walks rounds gw, gw + W, … (W warps in the grid)
// and has the rows of its next kRowStages − 1 rounds copied into its shared
// memory slots while it computes the current one, so its arithmetic runs
// under its own loads and no CTA-wide barrier is needed. The copies are TMA
// bulk copies (one per row, completion counted in bytes on the slot's
// mbarrier), not loads into registers, so the bytes in flight cost no
// occupancy. One lane owns 32 elements of a row, one MX block or two NVFP4
// blocks: no shuffles, one 16-byte store of codes. MXFP4 without smooth_k
// codes two elements per instruction (e2m1_pairs.cuh); NVFP4 and smooth_k
// take fp4_rows_kernel's fp32 steps (element minus mean, block amax, codes).
// (cp.async, 16 bytes a lane, measured 7 % slower; a columns kernel for Vᵀ
// on this warp-round plan lost to fp4_columns_kernel at S = 16384:
// NOTES-fp4.md.)

// Smem slots per warp and CTAs per SM: 8 warps × 3 slots of ≤ 2.2 KiB fit 4
// CTAs in an SM's 228 KiB at 64 registers a thread, no spills (perf log
// fp4-q19b: 1–4 % faster than 4 slots × 3 CTAs once NVFP4's path was short,
// the same before for MXFP4).
inline constexpr int kRowStages = 3;
inline constexpr int kRowStreamCtasPerSm = 4;
// With smooth_k a lane keeps its 32 channels' means in registers from one
// round to the next (they change only with the batch entry or head group):
// 2 CTAs per SM leave it 128 registers.
inline constexpr int kRowStreamSmoothCtasPerSm = 2;
template <bool kSmooth>
inline constexpr int kRowStreamCtas = kSmooth ? kRowStreamSmoothCtasPerSm : kRowStreamCtasPerSm;
inline constexpr int kRowPadBytes = 16;  // row pitch 2D + 16: the 8 lanes of an LDS.128 phase hit 8 bank groups
inline constexpr int kRowTableBytes = sizeof(NvDivisorTable);  // NVFP4's divisors, first
// then the barriers (rounded up to 128 bytes), then the slots
inline constexpr int kRowBarrierBytes = (kWarps * kRowStages * sizeof(std::uint64_t) + 127) / 128 * 128;
static_assert((kRowTableBytes + kRowBarrierBytes) % 128 == 0, "slots on 128-byte boundaries");

// q = n / d for 0 ≤ n < 2^31 by a multiply: m = ceil(2^(31 + l) / d), l =
// ceil(log2 d), q = umulhi(n, m) >> (l − 1) (m · d − 2^(31 + l) < d, so the
// error times n stays below 2^(31 + l)); d = 1 is passed through.
struct FastDivisor {
  unsigned d = 1, multiplier = 0, shift = 0;
  __device__ __forceinline__ unsigned quotient(unsigned n) const {
    return d == 1 ? n : __umulhi(n, multiplier) >> shift;
  }
};

// What fp4_rows_stream_kernel reads and writes; strides in bytes.
struct RowStreamJob {
  const unsigned char* in;
  std::int64_t stride_b, stride_s, stride_h;
  int S, H, D;
  int rows;                          // B·S·H rows of D elements
  int rounds;                        // warp rounds: rows / R, rounded up
  FastDivisor by_heads, by_tokens;   // row → (b·S + s, h) → (b, s)
  bool round_up;
  bool nvfp4;
  bool reverse;                      // rounds from the last: after a pass over the input, L2 holds its tail
  bool contiguous;                   // dense (B, S, H, D): a round is one run of bytes
  const float* mean;                 // smooth_k: (B, H, D), 16-byte aligned; else null
  const unsigned* amax;              // NVFP4: the tensor amax bits
  float* tensor_scale;               // NVFP4: S_enc, written by CTA 0
  std::uint8_t* codes;
  std::uint8_t* scales;
  int* nonfinite;
};

__device__ __forceinline__ void wait_slot(std::uint64_t* bar, unsigned parity) {
  while (!cuda::ptx::mbarrier_try_wait_parity(bar, parity)) {
  }
}

// Scale code and 32 codes (four words) of one MX block given as 16 pairs
// p[4g + j] = (element 8g + j, element 8g + j + 4); `bad` set on Inf / NaN.
template <class T>
__device__ __forceinline__ std::uint32_t mx_block_codes(const std::uint32_t (&p)[16], bool round_up,
                                                        std::uint32_t (&words)[4], bool& bad) {
  std::uint32_t m = 0;
#pragma unroll
  for (int i = 0; i < 16; i += 2) m = __vimax3_u16x2(m, p[i] & 0x7FFF7FFFu, p[i + 1] & 0x7FFF7FFFu);
  const std::uint32_t amax_bits = Pairs<T>::float_bits(max(m & 0xFFFFu, m >> 16));
  bad = amax_bits >= kInfBits;
  const std::uint32_t scale_code = mx_scale_code(amax_bits, round_up);
  if (mx_pairs_apply<T>(scale_code)) {
    const typename Pairs<T>::H2 factor = mx_pair_scale<T>(scale_code);
#pragma unroll
    for (int g = 0; g < 4; ++g) words[g] = mx_codes_x8<T>(p + 4 * g, factor);
  } else {
#pragma unroll
    for (int g = 0; g < 4; ++g) words[g] = mx_codes_x8_fp32<T>(p + 4 * g, scale_code);
  }
  return scale_code;
}

// Scale codes and 32 codes (four words) of 32 consecutive elements of a
// row in fp32, as fp4_rows_kernel computes them: element minus the mean
// (smooth_k), then one MX block, or two NVFP4 blocks whose scale codes are
// returned in the low and next byte. `bad` set on Inf / NaN.
// Segment g of x is the lane's chunk g ^ swizzle (see fp4_rows_stream_kernel),
// and so are mean[8g .. 8g + 7] when kSmooth; codes and scale codes stay in
// slot order. The fp32 values to code (x · 2^-k, or the NVFP4 quotient) go
// to the packed E2M1 encoder (e2m1_codes_x8_fp32).
template <class T, bool kSmooth>
__device__ __forceinline__ std::uint32_t float_block_codes(const Segment<T> (&x)[4], const float (&mean)[kMxfp4Block],
                                                           bool nvfp4, float s_enc, bool round_up,
                                                           const NvDivisorTable& divisors, std::uint32_t (&words)[4],
                                                           bool& bad) {
  float v[kMxfp4Block];
#pragma unroll
  for (int g = 0; g < 4; ++g)
#pragma unroll
    for (int e = 0; e < kSegment; ++e) v[kSegment * g + e] = element(x[g], e);
  if constexpr (kSmooth)
#pragma unroll
    for (int t = 0; t < kMxfp4Block; ++t) v[t] = __fsub_rn(v[t], mean[t]);
#pragma unroll
  for (int g = 0; g < 4; ++g) words[g] = 0;
  if (nvfp4) {
    std::uint32_t codes = 0;
    bad = false;
#pragma unroll
    for (int k = 0; k < kMxfp4Block / kNvfp4Block; ++k) {
      std::uint32_t mag = 0;
      if constexpr (kSmooth) {
        static_assert(kMxfp4Block == 2 * kNvfp4Block, "blocks k = 0 and 1 of the run");
        mag = k == 0 ? abs_max_bits<kNvfp4Block, 0>(v) : abs_max_bits<kNvfp4Block, kNvfp4Block>(v);
      } else {  // the input's own 16-bit magnitudes, two per instruction (segments 2k, 2k + 1 are the block)
        std::uint32_t m = 0;
#pragma unroll
        for (int g = 2 * k; g < 2 * k + 2; ++g)
#pragma unroll
          for (int i = 0; i < kSegment / 2; i += 2)
            m = __vimax3_u16x2(m, x[g].w[i] & 0x7FFF7FFFu, x[g].w[i + 1] & 0x7FFF7FFFu);
        mag = Pairs<T>::float_bits(max(m & 0xFFFFu, m >> 16));
      }
      bad |= mag >= kInfBits;
      const std::uint32_t scale_code = nv_scale_code(__uint_as_float(mag), s_enc);
      nv_block_codes(v, k * kNvfp4Block, s_enc, divisors[scale_code], words);
      codes |= scale_code << (8 * k);
    }
    return codes;
  }
  const std::uint32_t mag = abs_max_bits<kMxfp4Block, 0>(v);
  bad = mag >= kInfBits;
  const std::uint32_t scale_code = mx_scale_code(mag, round_up);
  mx_block_codes_fp32(v, exp2i(kE8M0Bias - static_cast<int>(scale_code)), words);  // 2^-k: exact products
  return scale_code;
}

// A round is R = 1024 / D consecutive rows of the (B, S, H) row order (heads
// fastest: the warps at work read a contiguous stretch of a dense input).
// Two ways to bring it into a slot:
//  * contiguous input (dense (B, S, H, D)): the round is 2 KiB of
//    consecutive bytes, one bulk copy by lane 0; lane ℓ computes the ℓ-th
//    64 bytes (32 elements). Read in order, the 8 lanes of an LDS.128 phase
//    would hit 2 of the 8 bank groups, so lane ℓ reads its 16-byte chunks in
//    the order g ^ ((ℓ >> 1) & 3): 8 bank groups, and an XOR keeps each
//    NVFP4 block's two chunks together. Codes are put back in order before
//    the store.
//  * otherwise: lane ℓ < R copies row ℓ to a row padded by 16 bytes, and
//    lane ℓ computes block ℓ / R of row ℓ mod R, so the 8 lanes of a phase
//    read 8 different rows, one bank group each thanks to the pad. The copy
//    per row costs a loop over the lanes (the bulk copy takes its operands
//    in uniform registers).
template <class T, bool kSmooth>
__global__ void __launch_bounds__(kThreads, kRowStreamCtas<kSmooth>) fp4_rows_stream_kernel(
    const __grid_constant__ RowStreamJob job) {
  extern __shared__ __align__(128) unsigned char smem[];
  const int warp = static_cast<int>(threadIdx.x) / kWarpSize, lane = static_cast<int>(threadIdx.x) % kWarpSize;
  const int rows_per_round = kWarpSize * kMxfp4Block / job.D;
  const unsigned row_bytes = 2u * static_cast<unsigned>(job.D);
  const int pitch = static_cast<int>(row_bytes) + (job.contiguous ? 0 : kRowPadBytes);
  const int slot_bytes = rows_per_round * pitch;
  NvDivisorTable& divisors = *reinterpret_cast<NvDivisorTable*>(smem);
  std::uint64_t* bars = reinterpret_cast<std::uint64_t*>(smem + kRowTableBytes) + warp * kRowStages;
  unsigned char* slots = smem + kRowTableBytes + kRowBarrierBytes + warp * kRowStages * slot_bytes;
  if (lane == 0) {  // one arrival per phase: lane 0's expect_tx
    for (int k = 0; k < kRowStages; ++k) cuda::ptx::mbarrier_init(&bars[k], 1);
    cuda::ptx::fence_mbarrier_init(cuda::ptx::sem_release, cuda::ptx::scope_cluster);
  }
  if (job.nvfp4) {
    divisors.fill(static_cast<int>(threadIdx.x), kThreads);
    __syncthreads();  // the table before any warp's first block
  }
  __syncwarp();

  const int warps = static_cast<int>(gridDim.x) * kWarps;
  const int first_round = static_cast<int>(blockIdx.x) * kWarps + warp;
  const bool packed = !kSmooth && !job.nvfp4;
  float mean[kMxfp4Block];  // kSmooth: the means of the lane's chunks, in slot order
  std::int64_t mean_slice = -1;
  // Row r of the (B, S, H) order → its (b, s, h).
  auto split = [&](int r, int& b, int& s, int& h) {
    const int bs = static_cast<int>(job.by_heads.quotient(static_cast<unsigned>(r)));
    h = r - bs * job.H;
    b = static_cast<int>(job.by_tokens.quotient(static_cast<unsigned>(bs)));
    s = bs - b * job.S;
  };
  // The last round may hold fewer rows: its other lanes compute on stale
  // slot bytes and store nothing.
  // Walk position → round: backwards with `reverse`.
  auto round_at = [&](int walk) { return job.reverse ? job.rounds - 1 - walk : walk; };
  auto issue = [&](int walk, int slot) {
    if (walk >= job.rounds) return;
    const int first = round_at(walk) * rows_per_round;
    const int count = min(rows_per_round, job.rows - first);
    if (job.contiguous) {
      if (lane == 0) {
        const unsigned bytes = static_cast<unsigned>(count) * row_bytes;
        cuda::ptx::mbarrier_arrive_expect_tx(cuda::ptx::sem_release, cuda::ptx::scope_cta, cuda::ptx::space_shared,
                                             &bars[slot], bytes);
        cuda::ptx::cp_async_bulk(cuda::ptx::space_cluster, cuda::ptx::space_global, slots + slot * slot_bytes,
                                 job.in + static_cast<std::int64_t>(first) * row_bytes, bytes, &bars[slot]);
      }
      return;
    }
    if (lane == 0)
      cuda::ptx::mbarrier_arrive_expect_tx(cuda::ptx::sem_release, cuda::ptx::scope_cta, cuda::ptx::space_shared,
                                           &bars[slot], static_cast<unsigned>(count) * row_bytes);
    __syncwarp();
    if (lane < count) {
      int b, s, h;
      split(first + lane, b, s, h);
      cuda::ptx::cp_async_bulk(cuda::ptx::space_cluster, cuda::ptx::space_global,
                               slots + slot * slot_bytes + lane * pitch,
                               job.in + b * job.stride_b + s * job.stride_s + h * job.stride_h, row_bytes, &bars[slot]);
    }
  };
#pragma unroll 1
  for (int i = 0; i < kRowStages - 1; ++i) issue(first_round + i * warps, i);
  // After a statistics pass this kernel is a programmatic dependent launch
  // (quantize_fp4.cu): its first copies (input only) are in flight before
  // it waits for the tensor amax or the means, and before it writes.
  cudaGridDependencySynchronize();
  float s_enc = 1.0f;
  if (job.nvfp4) {
    s_enc = nv_tensor_scale(__ldcg(job.amax));
    if (blockIdx.x == 0 && threadIdx.x == 0) *job.tensor_scale = s_enc;
  }

  const int blocks_per_row = job.D / kMxfp4Block;
  const int my_row = job.contiguous ? lane / blocks_per_row : lane % rows_per_round;
  const int my_block = job.contiguous ? lane % blocks_per_row : lane / rows_per_round;
  const unsigned swizzle = job.contiguous ? (static_cast<unsigned>(lane) >> 1) & 3u : 0u;
  bool bad = false;
#pragma unroll 1
  for (int i = 0;; ++i) {
    const int walk = first_round + i * warps;
    if (walk >= job.rounds) break;
    // The slot of round i + stages − 1 was last read in round i − 1, by every
    // lane before the __syncwarp that ended its reads.
    issue(walk + (kRowStages - 1) * warps, (i + kRowStages - 1) % kRowStages);
    const int row = round_at(walk) * rows_per_round + my_row;
    int b, s, h;
    split(min(row, job.rows - 1), b, s, h);  // lanes past the end compute on stale bytes, store nothing
    if constexpr (kSmooth) {
      // A warp steps 8 · gridDim rounds of 1024 / D rows, so a lane keeps
      // its head whenever H · D divides 8192 · gridDim (a power-of-two H
      // with H · D ≤ 8192, say): the means then load once per batch entry,
      // else every round. Loaded before the wait, their latency overlaps
      // the copy's.
      const std::int64_t slice = static_cast<std::int64_t>(b) * job.H + h;
      if (slice != mean_slice) {
        mean_slice = slice;
        const auto* m = reinterpret_cast<const float4*>(job.mean + slice * job.D + my_block * kMxfp4Block);
#pragma unroll
        for (int g = 0; g < 4; ++g)
#pragma unroll
          for (int k = 0; k < 2; ++k) {
            const float4 q = __ldg(m + 2 * (g ^ swizzle) + k);
            mean[8 * g + 4 * k] = q.x, mean[8 * g + 4 * k + 1] = q.y;
            mean[8 * g + 4 * k + 2] = q.z, mean[8 * g + 4 * k + 3] = q.w;
          }
      }
    }
    wait_slot(&bars[i % kRowStages], static_cast<unsigned>(i / kRowStages) & 1u);
    const uint4* src =
        reinterpret_cast<const uint4*>(slots + (i % kRowStages) * slot_bytes + my_row * pitch + my_block * 2 * kMxfp4Block);
    std::uint32_t words[4];
    bool block_bad;
    std::uint32_t scale_code;
    if (packed) {
      std::uint32_t p[16];
#pragma unroll
      for (int g = 0; g < 4; ++g) {
        const uint4 v = src[g ^ swizzle];
        const std::uint32_t w[4] = {v.x, v.y, v.z, v.w};
        segment_pairs(w, *reinterpret_cast<std::uint32_t(*)[4]>(p + 4 * g));
      }
      __syncwarp();
      scale_code = mx_block_codes<T>(p, job.round_up, words, block_bad);
    } else {
      Segment<T> x[4];
#pragma unroll
      for (int g = 0; g < 4; ++g) {
        const uint4 v = src[g ^ swizzle];
        x[g].w[0] = v.x, x[g].w[1] = v.y, x[g].w[2] = v.z, x[g].w[3] = v.w;
      }
      __syncwarp();
      scale_code = float_block_codes<T, kSmooth>(x, mean, job.nvfp4, s_enc, job.round_up, divisors, words, block_bad);
    }
    // Back to chunk order: slot g holds chunk g ^ swizzle. Bit 1 of the
    // swizzle also swaps the NVFP4 blocks, whose scale codes are the two bytes.
    if (swizzle & 1u) {
      const std::uint32_t w0 = words[0], w2 = words[2];
      words[0] = words[1], words[1] = w0, words[2] = words[3], words[3] = w2;
    }
    if (swizzle & 2u) {
      const std::uint32_t w0 = words[0], w1 = words[1];
      words[0] = words[2], words[1] = words[3], words[2] = w0, words[3] = w1;
      if (job.nvfp4) scale_code = __byte_perm(scale_code, 0, 0x3201);
    }
    if (row < job.rows) {
      bad |= block_bad;
      const std::int64_t out_row = static_cast<std::int64_t>(b * job.H + h) * job.S + s;
      __stcs(reinterpret_cast<uint4*>(job.codes + out_row * (job.D / 2) + my_block * 16),
             make_uint4(words[0], words[1], words[2], words[3]));
      if (job.nvfp4) {
        std::uint8_t* scale = job.scales + out_row * (job.D / kNvfp4Block) + 2 * my_block;
        scale[0] = static_cast<std::uint8_t>(scale_code), scale[1] = static_cast<std::uint8_t>(scale_code >> 8);
      } else {
        job.scales[out_row * (job.D / kMxfp4Block) + my_block] = static_cast<std::uint8_t>(scale_code);
      }
    }
  }
  if (bad) *job.nonfinite = 1;
}

// ---- NVFP4 tensor amax -------------------------------------------------------------

// Grid (CTAs, B). CTA x walks tokens x, x + gridDim.x, …, kAmaxItems at a
// time; its threads cover the H·D elements of a token in segments. The
// walk ends on the tensor's tail, which the quantize pass, running
// backwards, reads first.
template <class T>
__global__ void __launch_bounds__(kThreads) fp4_amax_kernel(const __grid_constant__ Job<T> job, unsigned* amax) {
  __shared__ unsigned scratch[kWarps];
  cudaTriggerProgrammaticLaunchCompletion();  // the quantize kernel may launch; it waits for this grid
  const int b = static_cast<int>(blockIdx.y);
  const int row_segments = job.H << job.seg_shift;
  const int mask = (1 << job.seg_shift) - 1;
  const int step = static_cast<int>(gridDim.x);
  std::uint32_t m = 0;
  for (int s0 = static_cast<int>(blockIdx.x); s0 < job.S; s0 += kAmaxItems * step)
    for (int j = static_cast<int>(threadIdx.x); j < row_segments; j += kThreads) {
      const int h = j >> job.seg_shift, first_d = kSegment * (j & mask);
      Segment<T> x[kAmaxItems];
#pragma unroll
      for (int r = 0; r < kAmaxItems; ++r) {
        const int s = s0 + r * step;
        if (s < job.S) load_segment<L2Reuse::keep>(job.in.segment(b, s, h, first_d), job.in.vector_loads, x[r]);
        else zero_segment(x[r]);
      }
#pragma unroll
      for (int r = 0; r < kAmaxItems; ++r)
#pragma unroll
        for (int e = 0; e < kSegment; ++e) m = max(m, magnitude_bits(element(x[r], e)));
    }
  if (m >= kInfBits) *job.nonfinite = 1;
  cta_max_to(m, scratch, amax);
}

// ---- smooth_k ------------------------------------------------------------------------

// One 128-token chunk of one batch entry: a thread walks four channels of
// one head down the chunk, so each channel's double sum is one dependent
// chain in ascending s, as the CPU adds; with want_range also the chunk's
// max and min per channel (the NVFP4 amax of k − mean follows from them:
// fl(k − m) is monotone in k, so its largest magnitude is at k's max or
// min). Four channels a thread rather than eight: twice the threads, and the
// grid is small (chunks × B × H·D / 512 CTAs). Grid: x = chunk ·
// channel_blocks + channel block (kMeanThreads quads), y = b.
template <class T>
__global__ void __launch_bounds__(kMeanThreads, kMeanCtasPerSm)
    fp4_mean_partial_kernel(const __grid_constant__ Job<T> job, Workspace ws, int chunks, int channel_blocks,
                            bool want_range) {
  cudaTriggerProgrammaticLaunchCompletion();  // the finalize kernel may launch; it waits for this grid
  const int chunk = static_cast<int>(blockIdx.x) / channel_blocks;
  const int quad = (static_cast<int>(blockIdx.x) % channel_blocks) * kMeanThreads + static_cast<int>(threadIdx.x);
  const int b = static_cast<int>(blockIdx.y);
  if (quad * kQuad >= job.H * job.D) return;
  const int h = (quad * kQuad) / job.D, d0 = (quad * kQuad) % job.D;
  const int s0 = chunk * kSequenceMeanChunk, tokens = min(kSequenceMeanChunk, job.S - s0);
  const T* p = job.in.segment(b, s0, h, d0);

  double sum[kQuad] = {};
  float hi[kQuad], lo[kQuad];
#pragma unroll
  for (int e = 0; e < kQuad; ++e) hi[e] = -FLT_MAX, lo[e] = FLT_MAX;
  std::uint32_t mag = 0;
  const auto take = [&](const float (&x)[kQuad]) {
#pragma unroll
    for (int e = 0; e < kQuad; ++e) {
      sum[e] += static_cast<double>(x[e]);
      hi[e] = fmaxf(hi[e], x[e]), lo[e] = fminf(lo[e], x[e]);
      mag = max(mag, magnitude_bits(x[e]));
    }
  };
  walk_quads<kMeanSumBatch, L2Reuse::keep>(p, job.in.stride_s, tokens, job.in.vector_loads, take);
  if (mag >= kInfBits) *job.nonfinite = 1;
  const std::int64_t at = (static_cast<std::int64_t>(b) * chunks + chunk) * (job.H * job.D) + quad * kQuad;
#pragma unroll
  for (int e = 0; e < kQuad; ++e) ws.k_partial[at + e] = sum[e];
  if (want_range)
#pragma unroll
    for (int e = 0; e < kQuad; ++e) ws.k_max[at + e] = hi[e], ws.k_min[at + e] = lo[e];
}

static_assert(2 * sizeof(float) * kWarps * kSumColumns + sizeof(unsigned) * kWarps <= sizeof(ChunkSumTile),
              "the finalize kernel's range and scratch fit in its chunk-sum ring");

// Per (b, channel): the chunk sums in ascending order, / S, to float; with
// want_amax the channel's largest |fl(k − mean)| into the tensor amax. A CTA
// takes kSumColumns channels of one batch entry (ordered_column_sums).
// Dynamic shared memory: a ChunkSumTile.
__global__ void __launch_bounds__(kThreads) fp4_mean_finalize_kernel(Workspace ws, int channels, int chunks, int S,
                                                                     float* mean, bool want_amax) {
  extern __shared__ __align__(16) unsigned char smem[];
  ChunkSumTile& tile = *reinterpret_cast<ChunkSumTile*>(smem);  // then reused for the range and the amax scratch
  cudaTriggerProgrammaticLaunchCompletion();  // the quantize kernel may launch; it waits for this grid
  cudaGridDependencySynchronize();            // the chunk sums are complete and visible
  const int groups = (channels + kSumColumns - 1) / kSumColumns;
  const int b = static_cast<int>(blockIdx.x) / groups, c0 = static_cast<int>(blockIdx.x) % groups * kSumColumns;
  const int columns = min(kSumColumns, channels - c0);
  const int warp = static_cast<int>(threadIdx.x) / kWarpSize, lane = static_cast<int>(threadIdx.x) % kWarpSize;
  const std::int64_t first = static_cast<std::int64_t>(b) * chunks * channels + c0;
  const double total = ordered_column_sums<kWarps>(ws.k_partial + first, channels, chunks, columns, tile);
  // The chunks' max and min need no order: each warp takes every kWarps-th chunk.
  float hi = -FLT_MAX, lo = FLT_MAX;
  auto* range = reinterpret_cast<float(*)[kWarps][kSumColumns]>(&tile);  // [0]: max, [1]: min
  auto* scratch = reinterpret_cast<unsigned*>(range + 2);
  if (want_amax) {
    if (lane < columns)
      for (int k = warp; k < chunks; k += kWarps) {
        const std::int64_t at = first + static_cast<std::int64_t>(k) * channels + lane;
        hi = fmaxf(hi, __ldcg(ws.k_max + at)), lo = fminf(lo, __ldcg(ws.k_min + at));
      }
    range[0][warp][lane] = hi, range[1][warp][lane] = lo;
    __syncthreads();
    if (warp == 0)
#pragma unroll
      for (int w = 1; w < kWarps; ++w) hi = fmaxf(hi, range[0][w][lane]), lo = fminf(lo, range[1][w][lane]);
  }
  std::uint32_t mag = 0;
  if (warp == 0 && lane < columns) {
    const float m = __double2float_rn(__ddiv_rn(total, static_cast<double>(S)));
    mean[static_cast<std::int64_t>(b) * channels + c0 + lane] = m;
    if (want_amax) mag = max(magnitude_bits(__fsub_rn(hi, m)), magnitude_bits(__fsub_rn(lo, m)));
  }
  if (want_amax) cta_max_to(mag, scratch, ws.amax);
}

}  // namespace fp4attn::cuda_quantize::fp4
