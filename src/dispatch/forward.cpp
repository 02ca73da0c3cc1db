// Executor choice: validate once, then run the sm90 kernels when this build has
// them, a Hopper GPU is present and the problem is one they implement (head
// dims they lack below 128 on the next width, head_dim_padding.hpp); the CPU
// emulator otherwise.
#include <algorithm>
#include <iterator>
#include <string>

#include "dispatch/head_dim_padding.hpp"
#include "dispatch/sm90_executor.hpp"
#include "fp4attn/attention.hpp"
#include "fp4attn/emulator.hpp"
#include "fp4attn/error.hpp"

namespace fp4attn {

bool cuda_built() {
#if defined(FP4ATTN_HAS_CUDA)
  return true;
#else
  return false;
#endif
}

bool sm90_available() {
  // Devices do not come and go during a process; ask the runtime once.
  static const bool present = dispatch::sm90_device_present();
  return present;
}

std::string device_description() {
  if (!cuda_built()) return "CPU-only build (no CUDA executors): running the CPU emulator";
  if (!sm90_available()) return "no CUDA GPU found: running the CPU emulator";
  return "compute-capability 9.0 GPU found: running the sm90 executor";
}

namespace {

std::string sm90_head_dim_list() {
  std::string list;
  for (int d : kSm90HeadDims) list += (list.empty() ? "" : ", ") + std::to_string(d);
  return list;
}

ForwardOutput run_emulator(const AttentionShape& shape, std::span<const float> q, std::span<const float> k,
                           std::span<const float> v, const AttentionOptions& opt) {
  emulator::ForwardResult r = emulator::forward(shape, q, k, v, opt);
  return ForwardOutput{std::move(r.o), std::move(r.lse), Executor::emulator};
}

ForwardOutput run_sm90(const AttentionShape& shape, std::span<const float> q, std::span<const float> k,
                       std::span<const float> v, const AttentionOptions& opt) {
  if (opt.target != Target::sm90)
    throw Error("executor", "the sm90 executor cannot run target " + std::string(to_string(opt.target)) +
                                " (only the emulator models it)");
  const std::int64_t d_run = dispatch::sm90_head_dim_for(shape.D);
  // Above 128 only the FP8 forward's D = 256 kernel exists: recipes fp8, mxfp4 and mxfp4_train.
  const bool wide_kernel = opt.recipe != Recipe::nvfp4;
  if (d_run == 0 || (shape.D > std::end(kSm90HeadDims)[-1] && !wide_kernel))
    throw Error("D", "D=" + std::to_string(shape.D) + " is not supported by the sm90 executor (D must be at most " +
                         std::to_string(std::end(kSm90HeadDims)[-1]) + ", or " +
                         std::to_string(kSm90Fp8ForwardMaxHeadDim) +
                         " with recipes other than nvfp4; its kernels run " + sm90_head_dim_list() +
                         ", narrower head dims with zero channels appended)");
  if (!cuda_built()) throw Error("executor", "this build has no CUDA executors");
  if (!sm90_available()) throw Error("executor", "no compute-capability 9.0 GPU found");
  // The recipe and tile checks are the executor's own (it names what it lacks);
  // non-finite input is reported by its GPU quantizer, naming the tensor.
  if (d_run == shape.D || sm90_supports(shape, opt)) return dispatch::sm90_forward(shape, q, k, v, opt);
  ForwardOutput out = dispatch::sm90_forward(
      dispatch::with_head_dim(shape, d_run), append_zero_channels(q, shape.D, d_run),
      append_zero_channels(k, shape.D, d_run), append_zero_channels(v, shape.D, d_run),
      dispatch::with_scale_of(opt, shape.D));
  out.o = first_channels(out.o, d_run, shape.D);
  return out;
}

}  // namespace

bool sm90_runs(const AttentionShape& shape, const AttentionOptions& opt) {
  if (!sm90_available() || !dispatch::sm90_grid_holds(shape)) return false;
  const std::int64_t d_run = dispatch::sm90_head_dim_for(shape.D);
  return sm90_supports(shape, opt) || (d_run != 0 && sm90_supports(dispatch::with_head_dim(shape, d_run), opt));
}

ForwardOutput forward(const AttentionShape& shape, std::span<const float> q, std::span<const float> k,
                      std::span<const float> v, const AttentionOptions& opt, Executor executor) {
  validate(shape, opt);
  validate_sizes(shape, q.size(), k.size(), v.size());
  switch (executor) {
    case Executor::automatic:
      if (sm90_runs(shape, opt)) return run_sm90(shape, q, k, v, opt);
      return run_emulator(shape, q, k, v, opt);
    case Executor::sm90: return run_sm90(shape, q, k, v, opt);
    case Executor::emulator: return run_emulator(shape, q, k, v, opt);
  }
  throw Error("executor", "unknown executor");
}

}  // namespace fp4attn
