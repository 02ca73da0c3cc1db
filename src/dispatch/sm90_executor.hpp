// The seam between dispatch and the Hopper kernels. Dispatch calls these two
// functions only; a CUDA build defines them next to the kernels, a CPU-only
// build gets the stand-ins in sm90_unavailable.cpp. Keeping the seam this
// small lets dispatch compile without any CUDA header.
#pragma once

#include <span>

#include "fp4attn/attention.hpp"

namespace fp4attn::dispatch {

// Forward attention on the sm90 executor. The caller has validated shape,
// options and sizes (validate, validate_sizes) and checked that the sm90
// executor supports the head dim; the result's executor field is sm90.
ForwardOutput sm90_forward(const AttentionShape& shape, std::span<const float> q, std::span<const float> k,
                           std::span<const float> v, const AttentionOptions& opt);

// True when a compute-capability 9.0 device is visible to the CUDA runtime.
bool sm90_device_present();

// benchmark_sm90 after its checks (shape validated, head dim supported, reps
// and warmup in range, a Hopper GPU present).
Sm90Benchmark sm90_benchmark(const AttentionShape& shape, const BenchOptions& opt);

}  // namespace fp4attn::dispatch
