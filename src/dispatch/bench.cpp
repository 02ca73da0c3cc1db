// benchmark_sm90: the checks of every public entry point, then the timing seam
// (sm90_bench_cuda.cpp, or the CPU-only stand-in).
#include <string>

#include "dispatch/sm90_executor.hpp"
#include "fp4attn/attention.hpp"
#include "fp4attn/error.hpp"

namespace fp4attn {

Sm90Benchmark benchmark_sm90(const AttentionShape& shape, const BenchOptions& opt) {
  AttentionOptions attention;
  attention.mask = opt.mask;
  attention.window = opt.window;
  validate(shape, attention);
  // The kernels' own head dims; D = 256 has recipe fp8's forward kernel only.
  const bool forward_only_dim = shape.D == kSm90Fp8ForwardMaxHeadDim;
  if (!sm90_supports(shape, attention) || !(sm90_kernel_head_dim(shape.D) || forward_only_dim)) {
    std::string dims;
    for (int d : kSm90HeadDims) dims += (dims.empty() ? "" : ", ") + std::to_string(d);
    throw Error("D", "D=" + std::to_string(shape.D) + " is not supported by the sm90 executor (D must be one of " +
                         dims + ", or " + std::to_string(kSm90Fp8ForwardMaxHeadDim) +
                         " without training; the benchmark times the kernels' own head dims)");
  }
  if (forward_only_dim && opt.training)
    throw Error("training", "D=" + std::to_string(shape.D) + " has no sm90 backward kernel to time");
  if (opt.reps < 1) throw Error("reps", "must be >= 1, got " + std::to_string(opt.reps));
  if (opt.warmup < 0) throw Error("warmup", "must be >= 0, got " + std::to_string(opt.warmup));
  constexpr const char* kNotEmulated = "; the CPU emulator is not benchmarked";
  if (!cuda_built()) throw Error("executor", std::string("this build has no CUDA executors") + kNotEmulated);
  if (!sm90_available()) throw Error("executor", std::string("no Hopper (sm_90) GPU found") + kNotEmulated);
  return dispatch::sm90_benchmark(shape, opt);
}

}  // namespace fp4attn
