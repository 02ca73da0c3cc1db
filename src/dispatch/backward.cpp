// Backward entry point on host arrays: validate once, then the sm90 kernels
// when this build has them, a Hopper GPU is present and they implement the
// call (recipes fp8 and mxfp4_train, target sm90, E4M3 dS; head dims they
// lack below 128 on the next width, head_dim_padding.hpp); the CPU emulator's
// FP8 backward otherwise.
#include <cmath>
#include <string>

#include "dispatch/head_dim_padding.hpp"
#include "dispatch/sm90_executor.hpp"
#include "fp4attn/attention.hpp"
#include "fp4attn/emulator.hpp"
#include "fp4attn/error.hpp"
#include "fp4attn/quantize.hpp"

namespace fp4attn {
namespace {

void check_count(std::size_t got, std::int64_t want, const char* name, const char* layout) {
  if (got != static_cast<std::size_t>(want))
    throw Error(name, "has " + std::to_string(got) + " elements, shape " + layout + " needs " + std::to_string(want));
}

// LSE is finite, or -inf for a row that sees no key; NaN and +inf are bad input.
void check_lse(std::span<const float> lse) {
  for (std::size_t i = 0; i < lse.size(); ++i)
    if (std::isnan(lse[i]) || lse[i] == INFINITY)
      throw Error("lse", "element " + std::to_string(i) + " is " + std::to_string(lse[i]) +
                             " (finite, or -inf for a fully masked row)");
}

BackwardOutput run_emulator(const AttentionShape& shape, std::span<const float> q, std::span<const float> k,
                            std::span<const float> v, std::span<const float> o, std::span<const float> lse,
                            std::span<const float> d_o, const AttentionOptions& opt) {
  emulator::BackwardResult r = emulator::backward(shape, q, k, v, o, lse, d_o, opt);
  return BackwardOutput{std::move(r.dq), std::move(r.dk), std::move(r.dv), Executor::emulator};
}

}  // namespace

BackwardOutput backward(const AttentionShape& shape, std::span<const float> q, std::span<const float> k,
                        std::span<const float> v, std::span<const float> o, std::span<const float> lse,
                        std::span<const float> d_o, const AttentionOptions& opt, Executor executor) {
  validate(shape, opt);
  if (!spec_of(opt.recipe).has_backward)
    throw Error("recipe", std::string(to_string(opt.recipe)) + " is inference only: no backward (use fp8 or mxfp4_train)");
  validate_sizes(shape, q.size(), k.size(), v.size());
  check_count(o.size(), shape.q_elems(), "o", "(B, Sq, Hq, D)");
  check_count(d_o.size(), shape.q_elems(), "d_o", "(B, Sq, Hq, D)");
  check_count(lse.size(), shape.lse_elems(), "lse", "(B, Hq, Sq)");
  require_finite(q, "q");
  require_finite(k, "k");
  require_finite(v, "v");
  require_finite(o, "o");
  require_finite(d_o, "d_o");
  check_lse(lse);
  const std::int64_t d_run = dispatch::sm90_head_dim_for(shape.D);
  const AttentionShape run_shape = dispatch::with_head_dim(shape, d_run);
  const bool sm90_runs = d_run != 0 && dispatch::sm90_backward_supports(run_shape, opt);
  const auto run_sm90 = [&] {
    if (!cuda_built()) throw Error("executor", "this build has no CUDA executors");
    if (!sm90_available()) throw Error("executor", "no compute-capability 9.0 GPU found");
    if (!sm90_runs)
      throw Error("executor", "the sm90 backward does not implement this call (it runs recipes fp8 and "
                              "mxfp4_train, target sm90, 128-token tiles, D ≤ 128, E4M3 dS)");
    if (d_run == shape.D) return dispatch::sm90_backward(shape, q, k, v, o, lse, d_o, opt);
    const auto pad = [&](std::span<const float> x) { return append_zero_channels(x, shape.D, d_run); };
    BackwardOutput out = dispatch::sm90_backward(run_shape, pad(q), pad(k), pad(v), pad(o), lse, pad(d_o),
                                                 dispatch::with_scale_of(opt, shape.D));
    for (std::vector<float>* g : {&out.dq, &out.dk, &out.dv}) *g = first_channels(*g, d_run, shape.D);
    return out;
  };
  switch (executor) {
    case Executor::automatic:
      if (sm90_available() && sm90_runs && dispatch::sm90_grid_holds(shape)) return run_sm90();
      return run_emulator(shape, q, k, v, o, lse, d_o, opt);
    case Executor::sm90: return run_sm90();
    case Executor::emulator: return run_emulator(shape, q, k, v, o, lse, d_o, opt);
  }
  throw Error("executor", "unknown executor");
}

}  // namespace fp4attn
