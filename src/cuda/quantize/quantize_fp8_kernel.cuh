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
//
// Staging: a CTA holds two tickets, the unit it runs and the next one, and
// copies the next unit's chunk into shared memory (cp.async, 16 bytes per
// segment, into the same (token, channel) places its own threads will read)
// while it runs the current one, so every CTA always has a chunk in flight.
// The slice statistics a quantize unit reads (K's mean, V's scales) travel
// with its chunk when they were final at decode time. Layouts that do not
// allow 16-byte loads skip the chunk's staging and load from global memory.
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

// A unit and the place of its chunk, decoded from its ticket once per unit by
// thread 0: the decode is 64-bit arithmetic, which, done by all 512 threads
// of every unit, cost a measurable share of the kernel (perf-log q2).
struct UnitPlace {
  Unit unit;
  int j, b, h, blk;   // the kv slice j (for Q: its K/V head's), batch, head, token block
  bool valid;         // false past the last ticket
  bool stats_staged;  // the slice statistics it reads were final when decoded: staged with the chunk
};

struct SharedScratch {
  std::uint32_t warp_max[kWarps];
  std::uint32_t channel_max[kWarps][kMaxHeadDim];
  UnitPlace place[3];  // the running unit, the staged one and the one after (rotating)
  alignas(kVectorBytes) float stats[2][kMaxHeadDim];  // staged k_mean or v_scale of the running and the next unit
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

// A thread's place in the chunk layout, the same for every unit: computed
// once per kernel. Recomputed per unit and element (signed divisions, the Vᵀ
// key permutation, 64-bit products), this index arithmetic was about half of
// the kernel's instructions (perf-log q2).
struct ThreadItems {
  int column;                         // segment column g: channels [8g, 8g + 8)
  int first_d;                        // 8g
  int quad[kMaxItems];                // quad of item r, or -1 when the chunk has fewer items (D < 64)
  int token[kMaxItems][kQuadTokens];  // token within the chunk of element i of item r (when quad[r] ≥ 0)
};

template <class T>
__device__ __forceinline__ ThreadItems thread_items(const Job<T>& job) {
  ThreadItems items;
  items.column = static_cast<int>(threadIdx.x) & ((1 << job.seg_shift) - 1);
  items.first_d = kSegment * items.column;
#pragma unroll
  for (int r = 0; r < kMaxItems; ++r) {
    const int item = static_cast<int>(threadIdx.x) + r * kThreads;
    items.quad[r] = item < (kQuadsPerChunk << job.seg_shift) ? item >> job.seg_shift : -1;
#pragma unroll
    for (int i = 0; i < kQuadTokens; ++i) items.token[r][i] = items.quad[r] < 0 ? 0 : quad_token(items.quad[r], i);
  }
  return items;
}

// Sequence position of element i of item r, or -1 past the tensor's end.
__device__ __forceinline__ int item_token(const ThreadItems& items, int r, int i, int s0, int S) {
  const int s = s0 + items.token[r][i];
  return items.quad[r] >= 0 && s < S ? s : -1;
}

template <L2Reuse R, class T>
__device__ __forceinline__ void load_chunk(const Job<T>& job, const ThreadItems& items, const InputView<T>& in, int b,
                                           int h, int s0, int S, Chunk<T>& c) {
  const T* first = in.segment(b, s0, h, items.first_d);  // 64-bit products once per unit
#pragma unroll
  for (int r = 0; r < kMaxItems; ++r)
#pragma unroll
    for (int i = 0; i < kQuadTokens; ++i) {
      const int s = item_token(items, r, i, s0, S);
      if (s >= 0) load_segment<R>(first + (s - s0) * in.stride_s, in.vector_loads, c.seg[r][i]);
      else zero_segment(c.seg[r][i]);
    }
}

// ---- staging one unit ahead -------------------------------------------------------

// The chunk a unit reads: which input, and where.
template <class T>
struct ChunkSource {
  InputView<T> view;  // a copy: a pointer into the kernel parameters compiles to generic loads
  bool reads;         // false for a unit that reads nothing (k_stats of a V-only call)
  int b, h, s0, S;
  L2Reuse reuse;
};

// The per-channel slice statistics a unit reads once they are final: K's
// mean (k_quantize, and q_quantize for the LSE correction) or V's scales.
template <class T>
__device__ __forceinline__ const float* slice_stats(const Job<T>& job, const UnitPlace& p) {
  const std::int64_t at = static_cast<std::int64_t>(p.j) * job.D;
  switch (p.unit.kind) {
    case UnitKind::k_quantize: return job.out.k_mean + at;
    case UnitKind::v_quantize: return job.out.v_scale + at;
    case UnitKind::q_quantize: return job.smooth_k ? job.out.k_mean + at : nullptr;
    default: return nullptr;
  }
}

template <class T>
__device__ __forceinline__ UnitPlace place_of(const Job<T>& job, unsigned ticket) {
  UnitPlace p{};
  p.valid = ticket < job.tickets;
  if (!p.valid) return p;
  p.unit = job.order.unit(ticket);
  const int chunk = static_cast<int>(p.unit.chunk);  // < 2^31: the host checks the ticket count
  if (p.unit.kind == UnitKind::q_quantize) {
    const int bh = chunk / job.q_blocks;
    p.blk = chunk % job.q_blocks, p.b = bh / job.Hq, p.h = bh % job.Hq;
    p.j = p.b * job.Hkv + p.h / (job.Hq / job.Hkv);
  } else {
    p.j = chunk / job.k_blocks, p.blk = chunk % job.k_blocks;
    p.b = p.j / job.Hkv, p.h = p.j % job.Hkv;
  }
  // Staged by 16-byte copies, so only from a 16-byte aligned array (the
  // caller's buffers need not be).
  const float* stats = slice_stats(job, p);
  if (stats != nullptr && reinterpret_cast<std::uintptr_t>(stats) % kVectorBytes == 0) {
    cuda::atomic_ref<unsigned, cuda::thread_scope_device> ready(job.ws.ready[p.j]);
    p.stats_staged = ready.load(cuda::memory_order_relaxed) != 0;
  }
  return p;
}

template <class T>
__device__ __forceinline__ ChunkSource<T> source_of(const Job<T>& job, const UnitPlace& p) {
  ChunkSource<T> src;
  src.b = p.b, src.h = p.h, src.s0 = p.blk * kTokenBlock;
  src.reads = true, src.reuse = L2Reuse::last;
  const UnitKind kind = p.unit.kind;
  if (kind == UnitKind::q_quantize) {
    src.view = job.q, src.S = job.Sq;
    return src;
  }
  src.S = job.Sk;
  const bool k_unit = kind == UnitKind::k_stats || kind == UnitKind::k_quantize;
  src.reads = !k_unit || job.out.k != nullptr;  // a V-only call reads no K
  src.view = k_unit ? job.k : job.v;
  // Statistics reads are read again by the quantize pass; everything else is final.
  const bool read_again = (kind == UnitKind::k_stats && job.smooth_k) || kind == UnitKind::v_stats;
  src.reuse = read_again ? L2Reuse::keep : L2Reuse::last;
  return src;
}

template <class T>
__device__ __forceinline__ bool stageable(const ChunkSource<T>& src) {
  return src.reads && src.view.vector_loads;
}

__device__ __forceinline__ std::uint64_t l2_policy(L2Reuse r) {
  std::uint64_t policy;
  if (r == L2Reuse::keep) asm("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(policy));
  else asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
  return policy;
}

__device__ __forceinline__ void copy_async_16(void* smem, const void* global, std::uint64_t policy) {
  const auto dst = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2;" ::"r"(dst), "l"(global), "l"(policy)
               : "memory");
}

__device__ __forceinline__ void commit_copies() { asm volatile("cp.async.commit_group;" ::: "memory"); }

// Waits for every copy this thread started; a barrier after it makes them
// visible to the whole CTA.
__device__ __forceinline__ void wait_copies() { asm volatile("cp.async.wait_all;" ::: "memory"); }

// Starts this thread's copies of a unit's chunk into `stage` (token-major,
// D elements a token) and, when they were final at decode time, of the slice
// statistics it reads into `stats` (D floats; the first D / 4 threads copy 16
// bytes each).
template <class T>
__device__ __forceinline__ void stage_unit(const Job<T>& job, const ThreadItems& items, const UnitPlace& p, T* stage,
                                           float* stats) {
  if (p.stats_staged && static_cast<int>(threadIdx.x) < job.D / 4) {
    const int at = 4 * static_cast<int>(threadIdx.x);
    copy_async_16(stats + at, slice_stats(job, p) + at, l2_policy(L2Reuse::keep));
  }
  const ChunkSource<T> src = source_of(job, p);
  if (stageable(src)) {
    const std::uint64_t policy = l2_policy(src.reuse);
    const int first_d = items.first_d;
    const T* first = src.view.segment(src.b, src.s0, src.h, first_d);  // 64-bit products once per unit
    constexpr int kCopies = sizeof(Segment<T>) / kVectorBytes;
#pragma unroll
    for (int r = 0; r < kMaxItems; ++r)
#pragma unroll
      for (int i = 0; i < kQuadTokens; ++i) {
        const int s = item_token(items, r, i, src.s0, src.S);
        if (s < 0) continue;
        const T* from = first + (s - src.s0) * src.view.stride_s;
        T* to = stage + (s - src.s0) * job.D + first_d;
#pragma unroll
        for (int v = 0; v < kCopies; ++v)
          copy_async_16(reinterpret_cast<char*>(to) + v * kVectorBytes,
                        reinterpret_cast<const char*>(from) + v * kVectorBytes, policy);
      }
  }
  commit_copies();
}

// A unit's chunk into registers: from its staged copy when there is one
// (the caller has waited for it), else straight from global memory.
template <L2Reuse R, class T>
__device__ __forceinline__ void fetch_chunk(const Job<T>& job, const ThreadItems& items, const InputView<T>& in, int b,
                                            int h, int s0, int S, const T* staged, Chunk<T>& c) {
  if (staged == nullptr || !in.vector_loads) return load_chunk<R>(job, items, in, b, h, s0, S, c);
  const int first_d = items.first_d;
#pragma unroll
  for (int r = 0; r < kMaxItems; ++r)
#pragma unroll
    for (int i = 0; i < kQuadTokens; ++i) {
      const int s = item_token(items, r, i, s0, S);
      if (s < 0) {
        zero_segment(c.seg[r][i]);
        continue;
      }
      const auto* from = reinterpret_cast<const uint4*>(staged + (s - s0) * job.D + first_d);
      if constexpr (sizeof(T) == sizeof(float)) {
#pragma unroll
        for (int v = 0; v < kSegment / 4; ++v) {
          const uint4 w = from[v];
          c.seg[r][i].f[4 * v] = __uint_as_float(w.x), c.seg[r][i].f[4 * v + 1] = __uint_as_float(w.y);
          c.seg[r][i].f[4 * v + 2] = __uint_as_float(w.z), c.seg[r][i].f[4 * v + 3] = __uint_as_float(w.w);
        }
      } else {
        const uint4 w = from[0];
        c.seg[r][i].w[0] = w.x, c.seg[r][i].w[1] = w.y, c.seg[r][i].w[2] = w.z, c.seg[r][i].w[3] = w.w;
      }
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

// A unit's 8 statistics of this thread's channels: staged with its chunk, or
// (not final when the unit was decoded) read after the slice's flag. Uniform
// over the CTA: p comes from shared memory.
template <class T>
__device__ __forceinline__ void read_slice_stats(const Job<T>& job, const ThreadItems& items, const UnitPlace& p,
                                                 const float* staged_stats, float (&out)[kSegment]) {
  if (p.stats_staged) {
#pragma unroll
    for (int e = 0; e < kSegment; ++e) out[e] = staged_stats[items.first_d + e];
    return;
  }
  wait_ready(job.ws.ready + p.j);
  const float* from = slice_stats(job, p) + items.first_d;
#pragma unroll
  for (int e = 0; e < kSegment; ++e) out[e] = __ldcg(from + e);
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
__device__ float quantize_token_block(const Job<T>& job, const ThreadItems& items, const Chunk<T>& c,
                                      const float (&mean)[kSegment], int b, int h, int blk, int S, int H,
                                      std::uint8_t* codes, float* scales, int* nonfinite, SharedScratch& sh,
                                      std::uint32_t (&words)[kMaxItems][kQuadTokens][2]) {
  const int s0 = blk * kTokenBlock;
  std::uint32_t mag = 0;
#pragma unroll
  for (int r = 0; r < kMaxItems; ++r)
#pragma unroll
    for (int i = 0; i < kQuadTokens; ++i)
      if (item_token(items, r, i, s0, S) >= 0)
#pragma unroll
        for (int e = 0; e < kSegment; ++e) mag = max(mag, magnitude_bits(element(c.seg[r][i], e) - mean[e]));
  const std::uint32_t amax_bits = block_max(mag, sh);
  if (amax_bits >= kInfBits && threadIdx.x == 0) *nonfinite = 1;
  const float scale = fp8_scale_of(__uint_as_float(amax_bits));
  if (threadIdx.x == 0) scales[(static_cast<std::int64_t>(b) * H + h) * ((S + kTokenBlock - 1) / kTokenBlock) + blk] = scale;

  const E4M3Divisor div = make_divisor(scale);
  // Codes are (B, S, H, D): one token further is H·D bytes.
  std::uint8_t* first = codes + ((static_cast<std::int64_t>(b) * S + s0) * H + h) * job.D + items.first_d;
  const int token_bytes = H * job.D;
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
      const int s = item_token(items, r, i, s0, S);
      if (s >= 0)
        __stcs(reinterpret_cast<uint2*>(first + static_cast<std::int64_t>(s - s0) * token_bytes),
               make_uint2(words[r][i][0], words[r][i][1]));
    }
  return scale;
}

// K chunk, first read. smooth_k: double sum per channel in ascending s,
// staged through shared memory so one thread walks one channel. Otherwise the
// final codes (K needs no second read).
template <class T>
__device__ __forceinline__ void k_stats(const Job<T>& job, const ThreadItems& items, const UnitPlace& p,
                                        SharedScratch& sh, const T* staged, T* tile) {
  if (job.out.k == nullptr) return;  // V-only call: its tickets stay, K is never read
  const int j = p.j, b = p.b, h = p.h, blk = p.blk;
  const int s0 = blk * kTokenBlock;
  Chunk<T> c;
  if (!job.smooth_k) {
    fetch_chunk<L2Reuse::last>(job, items, job.k, b, h, s0, job.Sk, staged, c);
    const float zero[kSegment] = {};
    std::uint32_t words[kMaxItems][kQuadTokens][2];
    quantize_token_block(job, items, c, zero, b, h, blk, job.Sk, job.Hkv, job.out.k, job.out.k_scale,
                         job.out.nonfinite + kK, sh, words);
    return;
  }
  fetch_chunk<L2Reuse::keep>(job, items, job.k, b, h, s0, job.Sk, staged, c);
  // A staged chunk is already the token-major tile the channel sums read.
  const bool in_tile = staged != nullptr && job.k.vector_loads;
  if (in_tile) tile = const_cast<T*>(staged);
  const int first_d = items.first_d;
  bool bad = false;
#pragma unroll
  for (int r = 0; r < kMaxItems; ++r)
#pragma unroll
    for (int i = 0; i < kQuadTokens; ++i) {
      const int s = item_token(items, r, i, s0, job.Sk);
      if (s < 0) continue;
#pragma unroll
      for (int e = 0; e < kSegment; ++e) bad |= magnitude_bits(element(c.seg[r][i], e)) >= kInfBits;
      if (!in_tile) store_segment(tile + (s - s0) * job.D + first_d, c.seg[r][i]);
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
    job.ws.k_partial[p.unit.chunk * job.D + d] = sum;
  }
  arrive(job, j, sh);
}

// V chunk, first read: per-channel amax into the slice's running maximum.
template <class T>
__device__ __forceinline__ void v_stats(const Job<T>& job, const ThreadItems& items, const UnitPlace& p,
                                        SharedScratch& sh, const T* staged) {
  const int j = p.j, b = p.b, h = p.h, blk = p.blk;
  Chunk<T> c;
  fetch_chunk<L2Reuse::keep>(job, items, job.v, b, h, blk * kTokenBlock, job.Sk, staged, c);
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
__device__ __forceinline__ void k_quantize(const Job<T>& job, const ThreadItems& items, const UnitPlace& p,
                                           SharedScratch& sh, const T* staged, const float* staged_stats) {
  const int b = p.b, h = p.h, blk = p.blk;
  Chunk<T> c;
  fetch_chunk<L2Reuse::last>(job, items, job.k, b, h, blk * kTokenBlock, job.Sk, staged, c);
  float mean[kSegment];
  read_slice_stats(job, items, p, staged_stats, mean);
  std::uint32_t words[kMaxItems][kQuadTokens][2];
  quantize_token_block(job, items, c, mean, b, h, blk, job.Sk, job.Hkv, job.out.k, job.out.k_scale,
                       job.out.nonfinite + kK, sh, words);
}

// V chunk, second read: codes of v / scale[d], staged as Vᵀ words (a quad's
// four keys of one channel) and written out one 128-key row per channel.
template <class T>
__device__ __forceinline__ void v_quantize(const Job<T>& job, const ThreadItems& items, const UnitPlace& p,
                                           SharedScratch& sh, const T* staged, const float* staged_stats,
                                           std::uint32_t* tile) {
  const int j = p.j, b = p.b, h = p.h, blk = p.blk;
  Chunk<T> c;
  fetch_chunk<L2Reuse::last>(job, items, job.v, b, h, blk * kTokenBlock, job.Sk, staged, c);
  const int g = items.column;
  float scale[kSegment];
  read_slice_stats(job, items, p, staged_stats, scale);
#pragma unroll
  for (int e = 0; e < kSegment; ++e) {
    const E4M3Divisor div = make_divisor(scale[e]);
#pragma unroll
    for (int r = 0; r < kMaxItems; ++r) {
      const int q = items.quad[r];
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
__device__ __forceinline__ void q_quantize(const Job<T>& job, const ThreadItems& items, const UnitPlace& p,
                                           SharedScratch& sh, const T* staged, const float* staged_stats) {
  const int blk = p.blk, h = p.h, b = p.b;
  const int s0 = blk * kTokenBlock;
  Chunk<T> c;
  fetch_chunk<L2Reuse::last>(job, items, job.q, b, h, s0, job.Sq, staged, c);
  const float zero[kSegment] = {};
  std::uint32_t words[kMaxItems][kQuadTokens][2];
  const float scale = quantize_token_block(job, items, c, zero, b, h, blk, job.Sq, job.Hq, job.out.q, job.out.q_scale,
                                           job.out.nonfinite + kQ, sh, words);
  if (!job.smooth_k) return;

  const int g = items.column;
  float mean[kSegment];
  read_slice_stats(job, items, p, staged_stats, mean);
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
      const int s = item_token(items, r, i, s0, job.Sq);
      if (g == 0 && s >= 0)
        job.out.lse_shift[(static_cast<std::int64_t>(b) * job.Hq + h) * job.Sq + s] = job.softmax_scale * dot;
    }
}

// ---- the kernel -------------------------------------------------------------------

// Dynamic shared memory: two staging buffers of one chunk each, then the Vᵀ
// tile of v_quantize (quantize_fp8.cu sizes it).
template <class T>
__global__ void __launch_bounds__(kThreads, kMinCtasPerSm<T>) quantize_fp8_kernel(const __grid_constant__ Job<T> job) {
  extern __shared__ __align__(16) unsigned char smem[];
  __shared__ SharedScratch sh;
  const ThreadItems items = thread_items(job);
  // Staging buffer `slot`, by arithmetic: an array of two pointers indexed
  // by the loop's slot would live in local memory.
  const auto stage = [&](int slot) { return reinterpret_cast<T*>(smem) + slot * kTokenBlock * job.D; };
  auto* vt_tile = reinterpret_cast<std::uint32_t*>(smem + 2 * sizeof(T) * kTokenBlock * job.D);
  // Thread 0 holds two tickets ahead of the work: the next unit's chunk is
  // staged while the current one runs. Tickets are taken in increasing order
  // and a unit waits only on smaller ones, so the smallest unfinished ticket
  // always belongs to a running unit: holding one more cannot deadlock.
  if (threadIdx.x == 0) {
    sh.place[0] = place_of(job, atomicAdd(job.ws.ticket, 1u));
    sh.place[1] = place_of(job, atomicAdd(job.ws.ticket, 1u));
  }
  __syncthreads();
  // The places stay in shared memory (registers are the limit at two CTAs of
  // 512 threads per SM); the loop keeps their indices.
  int cur = 0, next = 1;
  if (sh.place[cur].valid) stage_unit(job, items, sh.place[cur], stage(0), sh.stats[0]);
  wait_copies();
  __syncthreads();
  int slot = 0;  // staging buffers of the running unit
  while (sh.place[cur].valid) {
    const int fill = 3 - cur - next;  // last read right after the barrier three units ago
    if (threadIdx.x == 0) sh.place[fill] = place_of(job, atomicAdd(job.ws.ticket, 1u));
    if (sh.place[next].valid) stage_unit(job, items, sh.place[next], stage(slot ^ 1), sh.stats[slot ^ 1]);
    T* staged = stage(slot);
    const float* staged_stats = sh.stats[slot];
    const UnitPlace& p = sh.place[cur];
    switch (p.unit.kind) {
      case UnitKind::k_stats: k_stats(job, items, p, sh, staged, staged); break;
      case UnitKind::v_stats: v_stats(job, items, p, sh, staged); break;
      case UnitKind::k_quantize: k_quantize(job, items, p, sh, staged, staged_stats); break;
      case UnitKind::v_quantize: v_quantize(job, items, p, sh, staged, staged_stats, vt_tile); break;
      case UnitKind::q_quantize: q_quantize(job, items, p, sh, staged, staged_stats); break;
    }
    // The next unit's copies, started a unit ago, are in; the barrier makes
    // them visible to every thread and ends every read of this unit's buffers
    // before the unit after next stages into them.
    wait_copies();
    __syncthreads();
    cur = next, next = fill;
    slot ^= 1;
  }
}

}  // namespace fp4attn::cuda_quantize
