// Which sm90 backward mode is faster for a problem (sm90_executor.hpp): a
// host rule from measurements, the same with or without CUDA in the build.
#include <algorithm>
#include <vector>

#include "dispatch/sm90_executor.hpp"
#include "fp4attn/error.hpp"

namespace fp4attn::dispatch {
namespace {

// The one pass wins from this many keys per query row on average (D = 64):
// through the torch layer (bench_torch_step.py, B·S = 32k, 32 heads) it
// gained 3 % at 256.5 (S = 512 causal), 5 % at 512 and 512.5, 9 % at 1024,
// 11 % at 2048.5 (S = 4k causal) once finalize_dq ran at the memory's pace
// (NOTES.md of the backward); shorter rows were not measured.
constexpr double kOnePassMinMeanKeys = 256.0;

}  // namespace

double mean_visible_keys(MaskKind mask, std::int64_t Sq, std::int64_t Sk, Window window) {
  if (Sq <= 0) return 0.0;
  if (window.bounded()) {  // a row at a time (O(Sq), next to the call's O(Sq·Sk) work)
    double keys = 0.0;
    for (std::int64_t i = 0; i < Sq; ++i) keys += static_cast<double>(visible_keys(mask, window, Sq, Sk, i).size());
    return keys / static_cast<double>(Sq);
  }
  if (mask == MaskKind::none) return static_cast<double>(Sk);
  // Row i sees clamp(i + c, 0, Sk) keys: none before row `first`, all Sk from
  // row `full` on, i + c in between.
  const std::int64_t c = mask == MaskKind::causal ? 1 + (Sk - Sq) : 1;
  const std::int64_t first = std::clamp<std::int64_t>(1 - c, 0, Sq);
  const std::int64_t full = std::clamp<std::int64_t>(Sk - c, first, Sq);
  const double rising = static_cast<double>(full - first) *
                        (static_cast<double>(first + full - 1) / 2.0 + static_cast<double>(c));
  return (rising + static_cast<double>(Sq - full) * static_cast<double>(Sk)) / static_cast<double>(Sq);
}

bool sm90_backward_one_pass_faster(const AttentionShape& shape, MaskKind mask, Window window) {
  return shape.D == 64 && mean_visible_keys(mask, shape.Sq, shape.Sk, window) >= kOnePassMinMeanKeys;
}

bool sm90_packed_backward_one_pass_faster(const std::vector<std::int64_t>& lens_q,
                                          const std::vector<std::int64_t>& lens_k, std::int64_t D, MaskKind mask,
                                          Window window) {
  if (lens_q.size() != lens_k.size()) throw Error("lens_k", "must give one length per sequence, as lens_q");
  double pairs = 0.0, rows = 0.0;
  for (std::size_t b = 0; b < lens_q.size(); ++b) {
    pairs += static_cast<double>(lens_q[b]) * mean_visible_keys(mask, lens_q[b], lens_k[b], window);
    rows += static_cast<double>(lens_q[b]);
  }
  return D == 64 && rows > 0.0 && pairs / rows >= kOnePassMinMeanKeys;
}

}  // namespace fp4attn::dispatch
