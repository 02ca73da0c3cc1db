// fp4attn command-line tool: `run`, `accuracy`, `info` and `bench` (one file each).
// Every failure ends in one line on stderr that names the bad argument and a
// nonzero exit status.
#include <cstdio>
#include <exception>
#include <string>

#include "commands.hpp"

namespace {

constexpr int kExitBadInput = 1;
constexpr int kExitFailure = 3;

std::string command_line(int argc, char** argv) {
  std::string s = "fp4attn";
  for (int i = 1; i < argc; ++i) s += std::string(" ") + argv[i];
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"fp4attn: FP8/FP4 FlashAttention with Direct-P, measured against an fp64 reference"};
  app.require_subcommand(1);
  const std::string command = command_line(argc, argv);
  fp4attn::cli::add_run_command(app, command);
  fp4attn::cli::add_accuracy_command(app, command);
  fp4attn::cli::add_info_command(app);
  fp4attn::cli::add_bench_command(app, command);
  try {
    app.parse(argc, argv);
  } catch (const CLI::Success& e) {
    return app.exit(e);  // --help
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return e.get_exit_code() != 0 ? e.get_exit_code() : kExitBadInput;
  } catch (const fp4attn::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return kExitBadInput;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return kExitFailure;
  }
  return 0;
}
