// Facts about the CLI's build: the version and build type fixed when it was
// configured (CMake passes them as defines), the commit read at build time.
#pragma once

namespace fp4attn::cli {

// The short hash of the commit built, "+dirty" when tracked files differed from it.
const char* git_commit();
#if defined(FP4ATTN_VERSION)
inline constexpr const char* kVersion = FP4ATTN_VERSION;
#else
inline constexpr const char* kVersion = "unknown";
#endif
#if defined(FP4ATTN_BUILD_TYPE)
inline constexpr const char* kBuildType = FP4ATTN_BUILD_TYPE;
#else
inline constexpr const char* kBuildType = "unknown";
#endif

}  // namespace fp4attn::cli
