// The subcommands of `fp4attn`, one file each, plus the flag parsing they share.
#pragma once

#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "fp4attn/error.hpp"
#include "fp4attn/recipe.hpp"
#include "report.hpp"

namespace fp4attn::cli {

// `command_line` is recorded in --json output.
void add_run_command(CLI::App& app, const std::string& command_line);
void add_accuracy_command(CLI::App& app, const std::string& command_line);
void add_info_command(CLI::App& app);
void add_bench_command(CLI::App& app, const std::string& command_line);

// The DESIGN §8 grid point for sequence length S and head dim D (B·S = 32k
// tokens; 16 heads at D = 128, 32 at D = 64).
AttentionShape grid_shape(std::int64_t S, std::int64_t D);
// Prints an sm90 timing as `fp4attn bench` does: ms and TFLOP/s per op, and
// Direct-P's speed-up.
void print_sm90_benchmark(const AttentionShape& shape, const BenchOptions& timing, const Sm90Benchmark& result);

// Options both `run` and `accuracy` take.
struct CommonArgs {
  bool causal = false;
  std::vector<std::int64_t> window;  // LEFT RIGHT, or empty: none
  int threads = 0;
  std::string target = "sm90";
  std::vector<std::string> recipes;  // empty: all
  std::string json;
};
void add_common_options(CLI::App& cmd, CommonArgs& args);
Settings parse_settings(const CommonArgs& args);
// --window LEFT RIGHT, as `run`, `accuracy` and `bench` take it.
void add_window_option(CLI::App& cmd, std::vector<std::int64_t>& window);
// --window's two bounds (and --causal, which they must agree with), checked;
// none when not given.
Window parse_window(const std::vector<std::int64_t>& bounds, bool causal);

// Measures, prints the table and writes --json when asked.
void report(const Problem& problem, const Settings& settings, const CommonArgs& args, const std::string& command_line);

// The library names arguments after its own fields (Hq, D, ...); the CLI user
// knows the flag that set them. `rename` maps a library argument to a flag and
// returns "" for names it does not know, which pass through unchanged.
template <typename Rename, typename Body>
void with_flag_names(const Rename& rename, const Body& body) {
  try {
    body();
  } catch (const Error& e) {
    const std::string flag = rename(e.argument());
    if (flag.empty()) throw;
    throw Error(flag, std::string(e.what()).substr(e.argument().size() + 2));
  }
}

}  // namespace fp4attn::cli
