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
  validate(shape, attention);
  if (!sm90_supports(shape, attention) || !sm90_kernel_head_dim(shape.D)) {
    std::string dims;
    for (int d : kSm90HeadDims) dims += (dims.empty() ? "" : ", ") + std::to_string(d);
    throw Error("D", "D=" + std::to_string(shape.D) + " is not supported by the sm90 executor (D must be one of " +
                         dims + "; the benchmark times the kernels' own head dims)");
  }
  if (opt.reps < 1) throw Error("reps", "must be >= 1, got " + std::to_string(opt.reps));
  if (opt.warmup < 0) throw Error("warmup", "must be >= 0, got " + std::to_string(opt.warmup));
  constexpr const char* kNotEmulated = "; the CPU emulator is not benchmarked";
  if (!cuda_built()) throw Error("executor", std::string("this build has no CUDA executors") + kNotEmulated);
  if (!sm90_available()) throw Error("executor", std::string("no Hopper (sm_90) GPU found") + kNotEmulated);
  return dispatch::sm90_benchmark(shape, opt);
}

}  // namespace fp4attn
