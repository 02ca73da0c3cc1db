// The seam between dispatch and the Hopper kernels. Dispatch calls these two
// functions only; a CUDA build defines them next to the kernels, a CPU-only
// build gets the stand-ins in sm90_unavailable.cpp. Keeping the seam this
// small lets dispatch compile without any CUDA header.
#pragma once

#include <cstddef>
#include <cstdint>
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

// ---- Forward on tensors already on the device (the PyTorch layer's CUDA path).
// Declared in every build so that callers need no CUDA header; a CUDA build
// defines these in sm90_device_cuda.cpp, a CPU-only build in sm90_unavailable.cpp.

// Element type of q, k and v.
enum class DeviceElement : std::uint8_t { f32, f16, bf16 };

// A device tensor seen as (B, S, H, D): element strides on B, S and H, D contiguous.
struct DeviceTensorView {
  const void* data = nullptr;
  std::int64_t stride_b = 0, stride_s = 0, stride_h = 0;
};

struct DeviceForwardArgs {
  AttentionShape shape;
  DeviceElement element = DeviceElement::bf16;
  DeviceTensorView q, k, v;  // (B, Sq, Hq, D), (B, Sk, Hkv, D), (B, Sk, Hkv, D)
  void* o = nullptr;         // bf16 (B, Sq, Hq, D), element strides below (even)
  std::int64_t o_stride_b = 0, o_stride_s = 0, o_stride_h = 0;
  float* lse = nullptr;  // (B, Hq, Sq) contiguous, natural log
  // Scratch of at least sm90_device_workspace_bytes(shape) device bytes, any
  // content, 256-byte aligned; used by one call at a time (stream order).
  void* workspace = nullptr;
  std::size_t workspace_bytes = 0;
};

// Device bytes of DeviceForwardArgs::workspace for `shape`: the quantized
// operands, their scales and the quantizer's scratch.
std::size_t sm90_device_workspace_bytes(const AttentionShape& shape);

// Recipe-fp8 forward on device pointers, enqueued on `stream` (a cudaStream_t;
// null is the legacy default stream): the GPU quantizer, then the kernel. No
// allocation and no host synchronisation, so it may be captured in a CUDA
// graph. Validates shape and options (fp4attn::validate) and throws
// fp4attn::Error when the sm90 executor does not implement the call
// (sm90_supports), no Hopper GPU is present, or a pointer, stride or the
// workspace is unfit. Non-finite input is not reported (that would need a
// host synchronisation); the output is then unspecified.
void sm90_forward_device(const DeviceForwardArgs& args, const AttentionOptions& opt, void* stream);

}  // namespace fp4attn::dispatch
