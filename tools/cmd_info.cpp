// `fp4attn info`: what this build contains and what it will run on.
#include <cstdio>

#include "build_info.hpp"
#include "commands.hpp"

namespace fp4attn::cli {
namespace {

void info() {
  std::printf("fp4attn %s (commit %s, %s build)\n", kVersion, git_commit(), kBuildType);
  std::printf("CUDA executors: %s\n", cuda_built() ? "built (sm_90a)" : "not built (CPU-only)");
  std::printf("device: %s\n", device_description().c_str());
  std::printf("recipes:\n");
  for (Recipe r : kAllRecipes) {
    const RecipeSpec s = spec_of(r);
    std::printf("  %-12s Q,K %-9s V %-9s P %-9s %s\n", to_string(r).data(), to_string(s.qk).data(),
                to_string(s.v).data(), to_string(s.p).data(), s.has_backward ? "forward + backward" : "forward");
  }
  std::string sm90_dims;
  for (int d : kSm90HeadDims) sm90_dims += (sm90_dims.empty() ? "" : ", ") + std::to_string(d);
  std::printf("head dims: any multiple of %d in [%d, %d]; sm90 kernels %s (the forwards of fp8, mxfp4 and "
              "mxfp4_train also %d), narrower head dims run on them with zero channels (the emulator pads to a "
              "multiple of 32)\n",
              kHeadDimStep, kMinHeadDim, kMaxHeadDim, sm90_dims.c_str(), kSm90Fp8ForwardMaxHeadDim);
  std::printf("emulator targets: sm90 (FP4 expanded to E4M3), sm100 (block-scaled FP4)\n");
}

}  // namespace

void add_info_command(CLI::App& app) {
  app.add_subcommand("info", "Version, build and device facts")->callback(info);
}

}  // namespace fp4attn::cli
