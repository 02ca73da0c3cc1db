// Per-CTA timestamps of the FP8 forward, for dev/fwd_timeline: compiled in
// only when FP4ATTN_FWD_TIMELINE is defined. Otherwise every mark() is an
// empty inline function and the kernel's code does not change.
//
// One thread writes each mark of its CTA: SM clock cycles (clock64), except
// the globaltimer nanoseconds of kEntryNs / kOtherEndNs (comparable across
// SMs) and the SM id. "Consumer" is the first thread of consumer 0, "other"
// that of consumer 1.
#pragma once

namespace fp4attn::sm90::fwd::timeline {

enum Mark : int {
  kEntry,          // producer thread 0, first instruction
  kEntryNs,        // the same, globaltimer
  kSm,             // SM id
  kProducerStart,  // producer thread 0, after the CTA barrier, before the first copy
  kQReady,         // consumer: Q has landed
  kKv0Ready,       // consumer: K/V tile 0 has landed
  kS0Done,         // consumer: S of tile 0 is complete
  kSoftmax0Done,   // consumer: P of tile 0 is packed
  kLoopEnd,        // consumer: after the last QKᵀ turn's softmax
  kLastTurn,       // consumer: holds the turn for the last PV
  kLastPvDone,     // consumer: the last PV is complete
  kEnd,            // consumer: O and LSE stores issued
  kOtherLoopEnd,   // consumer 1: kLoopEnd
  kOtherEnd,       // consumer 1: kEnd
  kOtherEndNs,     // consumer 1: kEnd, globaltimer
  kMarks
};
inline constexpr int kCtas = 8192;  // CTAs past this many are not recorded
inline constexpr unsigned kProducer = 0, kConsumer = 128, kOther = 256;

#ifdef FP4ATTN_FWD_TIMELINE
// One copy per translation unit that launches the kernel (launch_d64.cu,
// launch_d64_three.cu, launch_d128.cu), each read through its own accessor.
static __device__ unsigned long long marks[kCtas][kMarks];
#endif

__device__ __forceinline__ void mark([[maybe_unused]] unsigned thread, [[maybe_unused]] Mark m) {
#ifdef FP4ATTN_FWD_TIMELINE
  if (threadIdx.x != thread) return;
  const unsigned cta = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  if (cta >= kCtas) return;
  unsigned long long v;
  if (m == kEntryNs || m == kOtherEndNs) {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(v));
  } else if (m == kSm) {
    unsigned sm;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
    v = sm;
  } else {
    v = clock64();
  }
  marks[cta][m] = v;
#endif
}

}  // namespace fp4attn::sm90::fwd::timeline
