// ex2::sm90_table() read at run time from the raw runs that ex2_scan writes
// (path in FP4ATTN_EX2_TABLE). Linked in place of the generated table, it lets
// one device call measure the table and run the GPU suites against an
// emulator that already uses it (build.sh, "verify" binaries).
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "emulator/ex2_sm90.hpp"

namespace fp4attn::emulator::ex2 {

std::span<const Run> sm90_table() {
  static const std::vector<Run> table = [] {
    std::vector<Run> t;
    const char* path = std::getenv("FP4ATTN_EX2_TABLE");
    FILE* f = path ? std::fopen(path, "rb") : nullptr;
    if (!f) {
      std::fprintf(stderr, "table_from_file: cannot read FP4ATTN_EX2_TABLE=%s\n", path ? path : "(unset)");
      std::abort();
    }
    Run r;
    while (std::fread(&r, sizeof r, 1, f) == 1) t.push_back(r);
    std::fclose(f);
    std::fprintf(stderr, "table_from_file: %zu runs from %s\n", t.size(), path);
    return t;
  }();
  return table;
}

}  // namespace fp4attn::emulator::ex2
