// Facts fixed when the CLI was configured (CMake passes them as defines).
#pragma once

namespace fp4attn::cli {

#if defined(FP4ATTN_GIT_COMMIT)
inline constexpr const char* kGitCommit = FP4ATTN_GIT_COMMIT;
#else
inline constexpr const char* kGitCommit = "unknown";
#endif
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
