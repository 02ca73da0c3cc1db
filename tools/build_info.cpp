// The commit the CLI was built from, read at build time (cmake/git_commit.cmake),
// so that --json results name the code that produced them.
#include "build_info.hpp"

#include "git_commit.hpp"

namespace fp4attn::cli {

const char* git_commit() { return FP4ATTN_GIT_COMMIT; }

}  // namespace fp4attn::cli
