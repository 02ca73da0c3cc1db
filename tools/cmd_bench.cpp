// `fp4attn bench`: device timing of the sm90 fp8 forward, Direct-P on and off,
// on pre-quantized inputs (op fwd), from bf16 inputs (op fwd_e2e) and from
// caller-quantized E4M3 inputs with per-head descales (op fwd_e4m3), with the
// DESIGN §8 defaults and result schema; with --training also forward +
// backward (op fwdbwd) and the backward alone (op bwd), as training runs them. The BF16 baselines need PyTorch and
// live in bench/bench_fwd.py.
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <memory>

#include "build_info.hpp"
#include "commands.hpp"

namespace fp4attn::cli {
namespace {

// The standard grid of DESIGN §8: B·S = 32k tokens, H = 16 at D = 128 and
// 32 at D = 64 (the same work per token), S = 8k as the headline point.
constexpr std::int64_t kGridTokens = 32768;
constexpr std::int64_t kDefaultS = 8192;
constexpr std::int64_t kDefaultD = 128;
constexpr std::int64_t kHeadsAtD64 = 32;
constexpr std::int64_t kHeadsAtD128 = 16;
constexpr std::int64_t kSmallHeadDim = 64;
constexpr double kMsPerSecond = 1e3;
constexpr double kFlopsPerTeraflop = 1e12;
constexpr double kBytesPerMegabyte = 1e6;

struct BenchArgs {
  AttentionShape shape{.B = 0, .Hq = 0, .Hkv = 0, .Sq = kDefaultS, .Sk = kDefaultS, .D = kDefaultD};
  std::int64_t s = kDefaultS;
  bool causal = false;
  std::vector<std::int64_t> window;  // --window LEFT RIGHT, or empty
  BenchOptions timing;
  std::string json;
};

// `s_given`: the lengths came from --S, so that is the flag to blame.
std::string flag_of(const std::string& argument, bool s_given) {
  if (argument == "B") return "--B";
  if (argument == "Hq") return "--H";
  if (argument == "Hkv") return "--Hkv";
  if (argument == "Sq") return s_given ? "--S" : "--Sq";
  if (argument == "Sk") return s_given ? "--S" : "--Sk";
  if (argument == "D") return "--D";
  if (argument == "reps") return "--reps";
  if (argument == "warmup") return "--warmup";
  if (argument == "executor") return "bench";
  return "";
}

// Sizes the user left out, from the ones given.
AttentionShape resolve_shape(CLI::App& cmd, const BenchArgs& args) {
  const auto set = [&](const char* flag) { return cmd.get_option(flag)->count() > 0; };
  AttentionShape shape = args.shape;
  if (set("--S")) shape.Sq = shape.Sk = args.s;
  if (!set("--H")) shape.Hq = shape.D == kSmallHeadDim ? kHeadsAtD64 : kHeadsAtD128;
  if (!set("--Hkv")) shape.Hkv = shape.Hq;
  if (!set("--B")) shape.B = std::max<std::int64_t>(1, kGridTokens / std::max<std::int64_t>(1, shape.Sq));
  return shape;
}

bool is_backward(TimedOp op) { return op == TimedOp::fwdbwd || op == TimedOp::bwd; }

nlohmann::json to_json(const AttentionShape& shape, const BenchArgs& args, const Sm90Benchmark& bench,
                       double flops, const std::string& command_line) {
  nlohmann::json doc = {{"date", today_utc()},
                        {"gpu", bench.gpu},
                        {"commit", git_commit()},
                        {"command", command_line},
                        {"timing", "CUDA events, median of " + std::to_string(args.timing.reps) + " runs after " +
                                       std::to_string(args.timing.warmup) + " warm-up runs, " +
                                       std::to_string(bench.input_sets) + " input sets rotated"},
                        {"rows", nlohmann::json::array()}};
  for (const Timing& t : bench.timings)
    doc["rows"].push_back({{"op", to_string(t.op)},
                           {"impl", "fp4attn"},
                           {"recipe", to_string(Recipe::fp8)},
                           {"direct_p", t.direct_p},
                           {"causal", args.causal},
                           {"window", args.timing.window.bounded()
                                          ? nlohmann::json({args.timing.window.left, args.timing.window.right})
                                          : nlohmann::json(nullptr)},
                           {"B", shape.B},
                           {"H", shape.Hq},
                           {"Hkv", shape.Hkv},
                           {"Sq", shape.Sq},
                           {"Sk", shape.Sk},
                           {"D", shape.D},
                           {"ms", t.ms},
                           {"tflops", flop_factor(t.op) * flops / (t.ms / kMsPerSecond) / kFlopsPerTeraflop},
                           {"gbps", nullptr},
                           {"deterministic", is_backward(t.op) ? nlohmann::json(bench.deterministic_backward)
                                                                : nlohmann::json(nullptr)}});
  return doc;
}

double ms_of(const Sm90Benchmark& bench, TimedOp op, bool direct_p) {
  for (const Timing& t : bench.timings)
    if (t.op == op && t.direct_p == direct_p) return t.ms;
  return 0.0;
}

}  // namespace

AttentionShape grid_shape(std::int64_t S, std::int64_t D) {
  const std::int64_t heads = D == kSmallHeadDim ? kHeadsAtD64 : kHeadsAtD128;
  return {.B = std::max<std::int64_t>(1, kGridTokens / S), .Hq = heads, .Hkv = heads, .Sq = S, .Sk = S, .D = D};
}

void print_sm90_benchmark(const AttentionShape& shape, const BenchOptions& timing, const Sm90Benchmark& result) {
  // TFLOP/s count the (query, key) pairs the mask and the window leave.
  const double flops = forward_flops(shape, timing.mask, timing.window);
  const std::string window = timing.window.bounded() ? ", window " + std::to_string(timing.window.left) + " " +
                                                           std::to_string(timing.window.right)
                                                     : "";
  std::printf("%s: B=%lld H=%lld Hkv=%lld Sq=%lld Sk=%lld D=%lld %s%s, recipe fp8\n", result.gpu.c_str(),
              static_cast<long long>(shape.B), static_cast<long long>(shape.Hq), static_cast<long long>(shape.Hkv),
              static_cast<long long>(shape.Sq), static_cast<long long>(shape.Sk), static_cast<long long>(shape.D),
              timing.mask == MaskKind::none ? "noncausal" : "causal", window.c_str());
  std::printf("CUDA events, median of %d runs after %d warm-up; %d input sets rotated (%.0f MB of E4M3 operands)\n",
              timing.reps, timing.warmup, result.input_sets, result.rotated_bytes / kBytesPerMegabyte);
  std::printf("%-8s %-8s %10s %10s\n", "op", "direct_p", "ms", "TFLOP/s");
  for (const Timing& t : result.timings)
    std::printf("%-8s %-8s %10.4f %10.1f\n", to_string(t.op).data(), t.direct_p ? "on" : "off", t.ms,
                flop_factor(t.op) * flops / (t.ms / kMsPerSecond) / kFlopsPerTeraflop);
  // Same work either way, so the speed-up is the ratio of times.
  if (ms_of(result, TimedOp::bwd, true) > 0.0)
    std::printf("backward: %s\n", result.deterministic_backward
                                      ? "two deterministic passes"
                                      : "one pass, dQ summed in an order that varies run to run (faster at this D)");
  std::printf("Direct-P on vs off:");
  for (TimedOp op : {TimedOp::fwd, TimedOp::fwd_e2e, TimedOp::fwd_e4m3, TimedOp::fwdbwd, TimedOp::bwd})
    if (ms_of(result, op, true) > 0.0)
      std::printf(" %s x%.3f", to_string(op).data(), ms_of(result, op, false) / ms_of(result, op, true));
  std::printf("\n");
  std::printf("cuDNN BF16 and FA2 BF16 comparisons come from bench/bench_fwd.py and bench/bench_bwd.py (PyTorch, "
              "same process); this CLI has no PyTorch\n");
}

namespace {

void bench(CLI::App& cmd, BenchArgs& args, const std::string& command_line) {
  const AttentionShape shape = resolve_shape(cmd, args);
  args.timing.mask = args.causal ? MaskKind::causal : MaskKind::none;
  args.timing.window = parse_window(args.window, args.causal);
  // Find an unwritable --json path before the run, not after it.
  if (!args.json.empty() && !std::ofstream(args.json, std::ios::app))
    throw Error("--json", "cannot write '" + args.json + "'");
  Sm90Benchmark result;
  const bool s_given = cmd.get_option("--S")->count() > 0;
  const auto rename = [s_given](const std::string& argument) { return flag_of(argument, s_given); };
  with_flag_names(rename, [&] { result = benchmark_sm90(shape, args.timing); });

  print_sm90_benchmark(shape, args.timing, result);
  const double flops = forward_flops(shape, args.timing.mask, args.timing.window);
  if (!args.json.empty()) write_json(to_json(shape, args, result, flops, command_line), args.json, "--json");
}

}  // namespace

void add_bench_command(CLI::App& app, const std::string& command_line) {
  auto args = std::make_shared<BenchArgs>();
  CLI::App* cmd = app.add_subcommand("bench", "Time the sm90 fp8 kernel on a Hopper GPU (DESIGN §8)");
  cmd->add_option("--B", args->shape.B, "Batch size (default: 32768 tokens / Sq)");
  cmd->add_option("--H", args->shape.Hq, "Query heads (default: 16 at D=128, 32 at D=64)");
  cmd->add_option("--Hkv", args->shape.Hkv, "Key/value heads (default: H; H must be a multiple)");
  CLI::Option* s = cmd->add_option("--S", args->s, "Query and key length (default 8192)");
  cmd->add_option("--Sq", args->shape.Sq, "Query length")->excludes(s);
  cmd->add_option("--Sk", args->shape.Sk, "Key length")->excludes(s);
  cmd->add_option("--D", args->shape.D, "Head dim (64 or 128; 256 without --training)");
  cmd->add_flag("--causal", args->causal, "Causal mask, bottom-right aligned when Sq != Sk");
  add_window_option(*cmd, args->window);
  cmd->add_flag("--training", args->timing.training,
                "Also time forward + backward (op fwdbwd) and the backward alone (op bwd) from bf16, as "
                "training runs them");
  cmd->add_option("--reps", args->timing.reps, "Timed runs per row; the median is reported");
  cmd->add_option("--warmup", args->timing.warmup, "Untimed runs before them");
  cmd->add_option("--json", args->json, "Also write the rows (bench/results schema) to this file");
  cmd->callback([cmd, args, command_line] { bench(*cmd, *args, command_line); });
}

}  // namespace fp4attn::cli
