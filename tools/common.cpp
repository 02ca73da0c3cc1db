// Flag parsing and the measure-print-save sequence shared by `run` and `accuracy`.
#include "commands.hpp"

#include <cstdio>
#include <fstream>

namespace fp4attn::cli {

void add_window_option(CLI::App& cmd, std::vector<std::int64_t>& window) {
  cmd.add_option("--window", window,
                 "Sliding window LEFT RIGHT, FlashAttention's window_size: query i sees keys i + Sk - Sq - LEFT "
                 "... i + Sk - Sq + RIGHT (-1: no bound on that side; with --causal RIGHT is -1 or 0)")
      ->expected(2)
      ->allow_extra_args(false);
}

void add_common_options(CLI::App& cmd, CommonArgs& args) {
  cmd.add_flag("--causal", args.causal, "Causal mask, bottom-right aligned when Sq != Sk");
  add_window_option(cmd, args.window);
  cmd.add_option("--threads", args.threads, "CPU emulator threads (0: all cores)");
  cmd.add_option("--target", args.target, "Numerics to emulate: sm90 (FP4 expanded to E4M3) or sm100");
  cmd.add_option("--recipe", args.recipes, "Recipes to run (fp8, mxfp4, nvfp4, mxfp4_train); default all");
  cmd.add_option("--json", args.json, "Also write the figures to this JSON file");
}

Settings parse_settings(const CommonArgs& args) {
  Settings s;
  const std::optional<Target> target = parse_target(args.target);
  if (!target) throw Error("--target", "'" + args.target + "' is not a target (sm90 or sm100)");
  s.target = *target;
  if (args.threads < 0) throw Error("--threads", "must be >= 0 (0 means all cores), got " + std::to_string(args.threads));
  s.threads = args.threads;
  if (!args.recipes.empty()) {
    s.recipes.clear();
    for (const std::string& name : args.recipes) {
      const std::optional<Recipe> r = parse_recipe(name);
      if (!r) throw Error("--recipe", "'" + name + "' is not a recipe (fp8, mxfp4, nvfp4 or mxfp4_train)");
      s.recipes.push_back(*r);
    }
  }
  return s;
}

Window parse_window(const std::vector<std::int64_t>& bounds, bool causal) {
  if (bounds.empty()) return {};
  const Window window{bounds[0], bounds[1]};
  try {
    check_window(causal ? MaskKind::causal : MaskKind::none, window);
  } catch (const Error& e) {
    throw Error("--window", e.what());
  }
  return window;
}

void report(const Problem& problem, const Settings& settings, const CommonArgs& args, const std::string& command_line) {
  // Find an unwritable --json path before the run, not after it.
  if (!args.json.empty() && !std::ofstream(args.json, std::ios::app))
    throw Error("--json", "cannot write '" + args.json + "'");
  AttentionOptions shape_check;
  shape_check.mask = problem.mask;
  shape_check.window = problem.window;
  validate(problem.shape, shape_check);
  validate_sizes(problem.shape, problem.q.size(), problem.k.size(), problem.v.size());
  std::printf("%s\n", device_description().c_str());
  std::fflush(stdout);  // before the progress lines on stderr
  const std::vector<Row> rows = measure(problem, settings);
  const std::string window = problem.window.bounded() ? ", window " + std::to_string(problem.window.left) + " " +
                                                             std::to_string(problem.window.right)
                                                       : "";
  std::printf("B=%lld Hq=%lld Hkv=%lld Sq=%lld Sk=%lld D=%lld %s%s, target %s; error of O vs the fp64 reference\n",
              static_cast<long long>(problem.shape.B), static_cast<long long>(problem.shape.Hq),
              static_cast<long long>(problem.shape.Hkv), static_cast<long long>(problem.shape.Sq),
              static_cast<long long>(problem.shape.Sk), static_cast<long long>(problem.shape.D),
              problem.mask == MaskKind::none ? "noncausal" : "causal", window.c_str(),
              to_string(settings.target).data());
  print_table(rows, stdout);
  if (!args.json.empty()) write_json(to_json(problem, rows, command_line), args.json, "--json");
}

}  // namespace fp4attn::cli
