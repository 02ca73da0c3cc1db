// libFuzzer target for the tensor-file readers: arbitrary bytes go to both the
// .npy and the .safetensors parser. The only acceptable outcomes are a tensor
// or an fp4attn::Error; any other exception, crash, sanitizer report or
// oversized allocation is a bug.
//
// Build (clang only; ordinary g++ builds never configure this folder):
//   cmake -S . -B build-fuzz -DCMAKE_CXX_COMPILER=clang++-14 -DFP4ATTN_CUDA=OFF \
//         -DFP4ATTN_BUILD_TESTS=OFF -DFP4ATTN_BUILD_FUZZERS=ON
//   cmake --build build-fuzz --target fuzz_readers -j2
// Run for a minute; new inputs go to the scratch folder (first argument),
// seeds are read from the committed corpus and the malformed-file corpus:
//   mkdir -p /tmp/fuzz_readers && build-fuzz/fuzz/fuzz_readers -max_total_time=60 \
//         /tmp/fuzz_readers fuzz/corpus tests/data/bad
// A crash leaves crash-<hash> in the working folder: add it to tests/data/bad
// with a .npy or .safetensors extension so test_io keeps checking it.
#include <cstddef>
#include <cstdint>
#include <span>

#include "fp4attn/error.hpp"
#include "fp4attn/io.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::span<const std::uint8_t> bytes(data, size);
  try {
    fp4attn::io::parse_npy(bytes);
  } catch (const fp4attn::Error&) {
  }
  // Both key paths: the only tensor, and a tensor picked by name (the seeds use "t").
  for (const char* key : {"", "t"}) {
    try {
      fp4attn::io::parse_safetensors(bytes, key);
    } catch (const fp4attn::Error&) {
    }
  }
  return 0;
}
