// Work splitting for the emulator: independent work items (one per batch,
// head and query tile, as the kernels' thread blocks) spread over std::threads.
#pragma once

#include <cstdint>
#include <functional>

namespace fp4attn::emulator {

// Calls fn(item) once for every item in [0, count) on up to `threads` threads
// (0 = all hardware threads). Items are handed out one at a time so that
// causal problems, whose late query tiles cost more, still balance. The first
// exception thrown by fn is rethrown after every thread has stopped.
void parallel_for(std::int64_t count, int threads, const std::function<void(std::int64_t)>& fn);

}  // namespace fp4attn::emulator
