// What the sm90 forward kernels (fp8_direct_p, nvfp4_bf16) share: the warp
// geometry and named barriers of a producer warpgroup with ping-ponging
// consumer warpgroups, where a thread's accumulator elements sit, the score
// mask, and the turn order of the consumers at the tensor core.
#pragma once

#include <cuda/ptx>

#include <cstdint>

#include "cuda/sm90/key_bounds.cuh"
#include "cuda/sm90/ptx.cuh"

namespace fp4attn::sm90::fwd {

inline constexpr int kWarpSize = 32;
inline constexpr int kWarpgroupThreads = 128;
inline constexpr int kSmemPerBlockLimit = 227 * 1024;  // sm_90 opt-in maximum per block
inline constexpr int kRegisterFile = 64 * 1024;        // 32-bit registers per SM

// Hardware named-barrier ids of the kernels (16 per CTA). Each turn barrier
// counts two warpgroups: its consumer syncs on it, the one before it arrives.
enum BarrierId : int {
  kBarrierSyncThreads = 0,  // reserved by __syncthreads
  kBarrierConsumerTurn = 1,  // + c: consumer c may issue its wgmmas
  kBarrierOStaged = 8,       // + c: consumer c's rows of O are in shared memory
  kBarrierFp4Staging = 15,   // the expanding producer warpgroup: a staging slot is read out
};
inline constexpr int kTurnBarrierThreads = 2 * kWarpgroupThreads;

inline constexpr float kLn2 = 0.693147180559945309f;
inline constexpr std::uint32_t kFullWarp = 0xFFFFFFFFu;
inline constexpr int kThreadsPerRow = 4;  // lanes of a quad share an accumulator row

FP4ATTN_DEVICE_INLINE float neg_inf() { return __int_as_float(0xFF800000); }

FP4ATTN_DEVICE_INLINE void wait_barrier(std::uint64_t* bar, std::uint32_t parity) {
  while (!cuda::ptx::mbarrier_try_wait_parity(bar, parity)) {
  }
}

// Where a thread's accumulator elements sit. Element 4j + 2r + e of an
// m64nN fp32 accumulator is row (16·warp + lane/4 + 8r), column 8j + 2·(lane%4) + e.
struct Fragment {
  int row[2];  // rows within the consumer's 64, for r = 0, 1
  int col;     // 2·(lane % 4)
  __device__ explicit Fragment(int thread_in_wg) {
    const int warp = thread_in_wg / kWarpSize, lane = thread_in_wg % kWarpSize;
    row[0] = 16 * warp + lane / kThreadsPerRow;
    row[1] = row[0] + 8;
    col = 2 * (lane % kThreadsPerRow);
  }
};

// threadIdx.x read anew: a volatile read is not merged with earlier ones, so
// what derives from it is rebuilt where it is needed instead of being held
// in registers through the tile loop.
FP4ATTN_DEVICE_INLINE int thread_index_reread() {
  int t;
  asm volatile("mov.u32 %0, %%tid.x;" : "=r"(t));
  return t;
}

// S = −inf where key ≥ Sk or outside the row's bounds. kLowerBound false
// tests the upper bound only (no window's left edge: bounds.lower never
// binds); the test per score is then half as long, and so is the masked
// block's code in a tile loop, which calls without a window measured at 2 %
// of the forward (docs/perf-log.md sw2).
template <bool kLowerBound, int N>
FP4ATTN_DEVICE_INLINE void mask_scores(float (&s)[N], const Fragment& f, int first_key, const int (&row_abs)[2], int Sk,
                                       const KeyBounds& bounds) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int limit = min(Sk - 1, row_abs[r] + bounds.upper);
    const int start = row_abs[r] + bounds.lower;
#pragma unroll
    for (int j = 0; j < N / 4; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int key = first_key + 8 * j + f.col + e;
        if (key > limit || (kLowerBound && key < start)) s[4 * j + 2 * r + e] = neg_inf();
      }
  }
}

// Pins the P operand in its registers at this point of the program. Before
// wgmma.fence it keeps the compiler from sinking P's last writes past the
// fence, which is what orders them before the product reads them; after the
// wait it keeps P's registers from being reused while PV still reads them.
template <int T>
FP4ATTN_DEVICE_INLINE void fence_p(std::uint32_t (&p)[T][4]) {
#pragma unroll
  for (int t = 0; t < T; ++t) fence_registers(p[t]);
}

// Ping-pong of the consumer warpgroups at the tensor core: each waits for its
// turn, issues its wgmmas and passes the turn to the next one (cyclically).
// `count` (≤ kConsumers) is how many take part: a CTA whose last consumers
// own only rows past Sq runs without them. With kEnabled false every call is
// a no-op and the consumers issue whenever they are ready.
template <int kConsumers, bool kEnabled = true>
struct TurnOrder {
  int consumer;
  int count = kConsumers;
  // Consumer 0 takes the first turn without being passed one.
  __device__ void open_first() const {
    if (kEnabled && consumer == 0) named_barrier_arrive(kBarrierConsumerTurn, kTurnBarrierThreads);
  }
  __device__ void wait() const {
    if (kEnabled) named_barrier_sync(kBarrierConsumerTurn + consumer, kTurnBarrierThreads);
  }
  // After the very last turn the last consumer passes to no one, which leaves
  // every turn barrier with as many arrivals as syncs.
  __device__ void pass(bool final_turn) const {
    if (!kEnabled || (final_turn && consumer == count - 1)) return;
    named_barrier_arrive(kBarrierConsumerTurn + (consumer + 1 == count ? 0 : consumer + 1), kTurnBarrierThreads);
  }
};

}  // namespace fp4attn::sm90::fwd
