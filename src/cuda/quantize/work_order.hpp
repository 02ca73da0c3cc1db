// Work order of the fused FP8 quantizer (quantize_fp8.cu), a plain header so
// the CPU tests can check it without a GPU.
//
// The kernel is a persistent grid whose CTAs take tickets from one counter
// and run the unit each ticket names. Units work on one 128-token chunk of
// one (b, h) slice:
//   k_stats     K chunk: double partial sums per channel (smooth_k), or the
//               final E4M3 codes when smooth_k is off (K is then read once)
//   v_stats     V chunk: per-channel amax
//   k_quantize  K chunk minus the slice's mean → codes (smooth_k only)
//   v_quantize  V chunk / the slice's per-channel scale → Vᵀ codes
//   q_quantize  Q chunk → codes (and the smooth_k LSE correction)
// The quantize units of a slice need the statistics of the whole slice, so
// the statistics pass runs `lead` kv chunks ahead of the quantize pass; both
// passes walk the slices in the same order, which keeps the second read of
// K and V within a window small enough to be served by L2. Q is read once,
// last, when every slice's mean is long known.
//
// A CTA waits only on units with smaller tickets, all of which have been
// taken by running CTAs that never wait on later tickets: the grid cannot
// deadlock, whatever the number of resident CTAs.
#pragma once

#include <cstdint>

#include "fp4attn/formats.hpp"

namespace fp4attn::cuda_quantize {

enum class UnitKind : std::uint8_t { k_stats, v_stats, k_quantize, v_quantize, q_quantize };

struct Unit {
  UnitKind kind;
  std::int64_t chunk;  // kv chunk (b, h, c) for k/v units, q chunk for q units; both (b, h)-major
};

struct WorkOrder {
  std::int64_t kv_chunks = 0;  // B · Hkv · ceil(Sk / 128)
  std::int64_t q_chunks = 0;   // B · Hq · ceil(Sq / 128)
  std::int64_t lead = 0;       // kv chunks of statistics ahead of the quantize pass, in [chunks per slice, kv_chunks]
  bool smooth_k = false;

  static constexpr int kStatsPerChunk = 2;  // k_stats, v_stats
  FP4ATTN_HD constexpr int quantize_per_chunk() const { return smooth_k ? 2 : 1; }
  FP4ATTN_HD constexpr std::int64_t tickets() const {
    return kv_chunks * (kStatsPerChunk + quantize_per_chunk()) + q_chunks;
  }

  // Ticket t → unit. Prologue: statistics of chunks [0, lead). Steady part:
  // step i holds the statistics of chunk lead + i, then the quantize units of
  // chunk i. Epilogue: the quantize units of the last `lead` chunks. Then Q.
  FP4ATTN_HD constexpr Unit unit(std::int64_t t) const {
    const int per_quantize = quantize_per_chunk();
    if (t < lead * kStatsPerChunk) return stats(t / kStatsPerChunk, t % kStatsPerChunk);
    t -= lead * kStatsPerChunk;
    const std::int64_t steady_steps = kv_chunks - lead;
    const std::int64_t step = kStatsPerChunk + per_quantize;
    if (t < steady_steps * step) {
      const std::int64_t i = t / step;
      const int r = static_cast<int>(t % step);
      return r < kStatsPerChunk ? stats(lead + i, r) : quantize(i, r - kStatsPerChunk);
    }
    t -= steady_steps * step;
    if (t < lead * per_quantize) return quantize(steady_steps + t / per_quantize, t % per_quantize);
    return {UnitKind::q_quantize, t - lead * per_quantize};
  }

 private:
  FP4ATTN_HD static constexpr Unit stats(std::int64_t chunk, std::int64_t r) {
    return {r == 0 ? UnitKind::k_stats : UnitKind::v_stats, chunk};
  }
  FP4ATTN_HD constexpr Unit quantize(std::int64_t chunk, std::int64_t r) const {
    return {smooth_k && r == 0 ? UnitKind::k_quantize : UnitKind::v_quantize, chunk};
  }
};

}  // namespace fp4attn::cuda_quantize
