// Random test and benchmark inputs made on the device, so that large problems
// need no host generation or upload.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace fp4attn::cuda_common {

// Fills `n` bf16 values (as raw bits) at `out` with standard-normal samples,
// none of them zero, on `stream`. The values depend only on (seed, index).
void fill_normal_bf16(std::uint16_t* out, std::int64_t n, std::uint64_t seed, cudaStream_t stream);

}  // namespace fp4attn::cuda_common
