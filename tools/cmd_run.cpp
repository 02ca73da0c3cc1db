// `fp4attn run`: the default problem through every recipe, Direct-P on and off.
#include <cstdint>
#include <cstdio>
#include <memory>

#include "commands.hpp"
#include "synthetic.hpp"

namespace fp4attn::cli {
namespace {

// Default problem: large enough for stable error figures, small enough that
// all eight emulator runs and the fp64 reference finish in well under a
// minute on two cores.
constexpr AttentionShape kDefaultShape{.B = 1, .Hq = 4, .Hkv = 4, .Sq = 1024, .Sk = 1024, .D = 128};
// --quick: a seconds-long smoke run (CI, tests).
constexpr AttentionShape kQuickShape{.B = 1, .Hq = 2, .Hkv = 2, .Sq = 256, .Sk = 256, .D = 64};
constexpr std::uint64_t kDefaultSeed = 20261129;
// Throughput is timed on the DESIGN §8 headline point, where the GPU is full;
// the accuracy problem above is too small to say anything about speed.
constexpr std::int64_t kThroughputS = 8192;
constexpr std::int64_t kThroughputD = 128;

struct RunArgs {
  AttentionShape shape = kDefaultShape;
  std::int64_t hkv = 0;  // used only when --Hkv is given; else Hkv = H
  std::uint64_t seed = kDefaultSeed;
  bool quick = false;
  CommonArgs common;
};

std::string flag_of(const std::string& argument) {
  if (argument == "B") return "--B";
  if (argument == "Hq") return "--H";
  if (argument == "Hkv") return "--Hkv";
  if (argument == "Sq") return "--Sq";
  if (argument == "Sk") return "--Sk";
  if (argument == "D") return "--D";
  return "";
}

void run(CLI::App& cmd, const RunArgs& args, const std::string& command_line) {
  AttentionShape shape = args.shape;
  const auto unset = [&](const char* flag) { return cmd.get_option(flag)->count() == 0; };
  // --quick changes only the sizes the user did not set.
  if (args.quick) {
    if (unset("--B")) shape.B = kQuickShape.B;
    if (unset("--H")) shape.Hq = kQuickShape.Hq;
    if (unset("--Sq")) shape.Sq = kQuickShape.Sq;
    if (unset("--Sk")) shape.Sk = kQuickShape.Sk;
    if (unset("--D")) shape.D = kQuickShape.D;
  }
  shape.Hkv = unset("--Hkv") ? shape.Hq : args.hkv;
  const Settings settings = parse_settings(args.common);
  const MaskKind mask = args.common.causal ? MaskKind::causal : MaskKind::none;
  const Window window = parse_window(args.common.window, args.common.causal);
  with_flag_names(flag_of, [&] {
    AttentionOptions opt;
    validate(shape, opt);  // before allocating inputs of an absurd shape
    Problem problem = make_synthetic(shape, mask, args.seed);
    problem.window = window;
    report(problem, settings, args.common, command_line);
  });
  if (!args.quick && sm90_available()) {
    const AttentionShape grid = grid_shape(kThroughputS, kThroughputD);
    BenchOptions timing;
    timing.mask = mask;
    timing.window = window;
    timing.training = true;
    std::printf("\nThroughput of the sm90 fp8 kernels, forward and training (`fp4attn bench` times other "
                "shapes):\n");
    print_sm90_benchmark(grid, timing, benchmark_sm90(grid, timing));
  }
}

}  // namespace

void add_run_command(CLI::App& app, const std::string& command_line) {
  auto args = std::make_shared<RunArgs>();
  CLI::App* cmd = app.add_subcommand("run", "Default problem through every recipe, Direct-P on and off");
  cmd->add_option("--B", args->shape.B, "Batch size");
  cmd->add_option("--H", args->shape.Hq, "Query heads");
  cmd->add_option("--Hkv", args->hkv, "Key/value heads (default: H; H must be a multiple)");
  cmd->add_option("--Sq", args->shape.Sq, "Query length");
  cmd->add_option("--Sk", args->shape.Sk, "Key length");
  cmd->add_option("--D", args->shape.D, "Head dim");
  cmd->add_option("--seed", args->seed, "Seed of the synthetic inputs");
  cmd->add_flag("--quick", args->quick, "Tiny problem for a smoke test");
  add_common_options(*cmd, args->common);
  cmd->callback([cmd, args, command_line] { run(*cmd, *args, command_line); });
}

}  // namespace fp4attn::cli
