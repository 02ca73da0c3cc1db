// The seam between dispatch and the Hopper kernels. Dispatch calls these two
// functions only; a CUDA build defines them next to the kernels, a CPU-only
// build gets the stand-ins in sm90_unavailable.cpp. Keeping the seam this
// small lets dispatch compile without any CUDA header.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "fp4attn/attention.hpp"
#include "fp4attn/error.hpp"

namespace fp4attn::dispatch {

// The most batch entries (or packed sequences) and query heads one sm90 call
// takes: its kernels' grids carry them in their y and z dimensions, which
// CUDA caps at 65535. A larger batch runs as several calls (the Python layer
// splits it; a C++ caller gets this error naming the argument).
inline constexpr std::int64_t kSm90MaxBatch = 65535;

// Whether one sm90 call's grids hold the shape's batch and query heads
// (automatic dispatch runs larger host calls on the emulator).
inline bool sm90_grid_holds(const AttentionShape& shape) {
  return shape.B <= kSm90MaxBatch && shape.Hq <= kSm90MaxBatch;
}

// A window bound as the kernels take it: an int, -1 for none. A bound of
// 2^29 keys or more binds no sequence the kernels run, so it is capped there.
inline int kernel_window_bound(std::int64_t bound) {
  return bound < 0 ? -1 : static_cast<int>(std::min<std::int64_t>(bound, std::int64_t{1} << 29));
}

inline void check_sm90_grid(const AttentionShape& shape) {
  if (shape.B > kSm90MaxBatch)
    throw Error("B", "batch size " + std::to_string(shape.B) + " is above " + std::to_string(kSm90MaxBatch) +
                         ", the most one sm90 call takes (its grids hold the batch); split the batch into calls");
  if (shape.Hq > kSm90MaxBatch)
    throw Error("Hq", std::to_string(shape.Hq) + " query heads are above " + std::to_string(kSm90MaxBatch) +
                          ", the most one sm90 call takes");
}

// Forward attention on the sm90 executor. The caller has validated shape,
// options and sizes (validate, validate_sizes) and checked that the sm90
// executor supports the head dim; the result's executor field is sm90.
ForwardOutput sm90_forward(const AttentionShape& shape, std::span<const float> q, std::span<const float> k,
                           std::span<const float> v, const AttentionOptions& opt);

// forward_e4m3 on the sm90 executor, after forward_e4m3's checks (sizes,
// codes and descales already checked on the host): copies in, runs
// sm90_forward_device_e4m3, copies out.
ForwardOutput sm90_forward_e4m3(const AttentionShape& shape, const E4m3Inputs& in, const AttentionOptions& opt);

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

// Packed sequences' token counts: the query tokens (rows of q, O, and the
// LSE's pitch) and the key tokens (rows of k and v) in all. Their calls lay
// every quantized operand and statistic out tile-aligned, sequence after
// sequence (each rounded up to 128 tokens: cuda/common/packed_rows.hpp), so
// that the workspace and the saved block grow with these counts. Zero: not
// packed (the (B, S) layout).
struct PackedTokens {
  std::int64_t q = 0, k = 0;
  bool packed() const { return q > 0 || k > 0; }
};

struct DeviceForwardArgs {
  AttentionShape shape;
  DeviceElement element = DeviceElement::bf16;
  DeviceTensorView q, k, v;  // (B, Sq, Hq, D), (B, Sk, Hkv, D), (B, Sk, Hkv, D)
  void* o = nullptr;         // bf16 (B, Sq, Hq, D), element strides below (even)
  std::int64_t o_stride_b = 0, o_stride_s = 0, o_stride_h = 0;
  float* lse = nullptr;  // (B, Hq, Sq) contiguous, natural log
  // Scratch of at least sm90_device_workspace_bytes(shape, recipe, packed tokens) device
  // bytes, any content, 256-byte aligned; used by one call at a time (stream order).
  void* workspace = nullptr;
  std::size_t workspace_bytes = 0;
  // Optional, recipes fp8 and mxfp4_train (training):
  // sm90_device_saved_bytes(shape, recipe, packed tokens) device bytes, any content,
  // 256-byte aligned. The forward leaves Q's and K's quantized operands
  // there, with the transposed copies the backward reads (fp8: 2 bytes per
  // element of Q and K in all; mxfp4_train: K's fold and its copy, Q's
  // MXFP4 codes, 2 and 0.53 bytes), so that the backward need not quantize
  // Q and K again. Null: nothing is kept.
  void* saved = nullptr;
  std::size_t saved_bytes = 0;
  // Optional, recipe fp8: packed sequences of different
  // lengths (FlashAttention's varlen batches). shape.B device ints + 1 each;
  // sequence b is token rows cu_seqlens_q[b] .. cu_seqlens_q[b + 1] − 1 of q
  // and O, and cu_seqlens_k[b] .. of k and v, whose batch strides are not
  // used; shape.Sq and shape.Sk are the longest sequences; the LSE is (Hq,
  // lse_pitch), lse_pitch the query tokens in all, k_tokens the key tokens
  // in all (PackedTokens{lse_pitch, k_tokens} size the workspace and the
  // saved block). The call checks cu_seqlens on the device, where they may
  // change between calls unseen by the host (a replayed CUDA graph): both
  // start at 0, never decrease, end at lse_pitch and k_tokens, and no
  // sequence is longer than shape.Sq / shape.Sk; where they do not, O and
  // the LSE are NaN (cuda_common::check_packed_sequences). shape.Sq and
  // shape.Sk may exceed the longest sequences (the grids' tiles past a
  // sequence's end leave at once).
  // Each sequence's O and LSE are those of a call on it alone, bit for bit.
  // `saved` keeps the operands in the packed layout: its backward takes the
  // same cu_seqlens and counts.
  const int* cu_seqlens_q = nullptr;
  const int* cu_seqlens_k = nullptr;
  std::int64_t lse_pitch = 0;
  std::int64_t k_tokens = 0;
};

// Recipe fp8's forward on tensors the caller has already quantized to E4M3
// (FlashAttention-3's FP8 interface). q, k, v: E4M3 codes (B, S, H, D), strides
// in elements (= bytes) on B, S and H, D contiguous; base addresses and strides
// multiples of 16 bytes (the kernel reads Q and K in place by TMA, D a multiple
// of 16 in [16, 256]). Each value is its code times its tensor's descale for
// (b, kv head): fp32 (B, Hkv), contiguous, finite and positive; null means 1.
// Options: recipe fp8, target sm90, smooth_k off (smoothing comes before
// quantization); mask, window, softmax scale and Direct-P as for
// sm90_forward_device. A NaN code or a bad descale makes O and the LSE NaN
// (checked on the device: no host synchronisation).
struct DeviceE4m3ForwardArgs {
  AttentionShape shape;
  DeviceTensorView q, k, v;
  const float* q_descale = nullptr;
  const float* k_descale = nullptr;
  const float* v_descale = nullptr;
  void* o = nullptr;  // bf16 (B, Sq, Hq, D), element strides below
  std::int64_t o_stride_b = 0, o_stride_s = 0, o_stride_h = 0;
  float* lse = nullptr;  // (B, Hq, Sq) contiguous, natural log
  // At least sm90_device_e4m3_workspace_bytes(shape, packed tokens) device
  // bytes, 256-byte aligned, any content: the broadcast scales, Vᵀ and the
  // NaN flags (packed sequences: also Q's and K's codes in the tile-aligned
  // layout, and the checked cu_seqlens).
  void* workspace = nullptr;
  std::size_t workspace_bytes = 0;
  // Optional: packed sequences of different lengths (FlashAttention's varlen
  // batches), as DeviceForwardArgs takes them: q (lse_pitch, Hq, D) and k, v
  // (k_tokens, Hkv, D) with strides on S and H (batch strides unused),
  // shape.B sequences, shape.Sq / shape.Sk at least the longest, the
  // descales (B, Hkv) per sequence, O packed and the LSE (Hq, lse_pitch).
  // cu_seqlens are checked on the device (O and the LSE NaN where they do
  // not fit). Each sequence's O and LSE are those of a call on it alone, bit
  // for bit. The preparation pass copies Q's and K's codes into the
  // tile-aligned layout (cuda/common/packed_rows.hpp) the kernel reads.
  const int* cu_seqlens_q = nullptr;
  const int* cu_seqlens_k = nullptr;
  std::int64_t lse_pitch = 0;
  std::int64_t k_tokens = 0;
};

std::size_t sm90_device_e4m3_workspace_bytes(const AttentionShape& shape, PackedTokens packed = {});

// Throws fp4attn::Error naming the argument (shape, options, pointers, alignment).
void sm90_forward_device_e4m3(const DeviceE4m3ForwardArgs& args, const AttentionOptions& opt, void* stream);

// Device bytes of DeviceForwardArgs::saved for `shape` and `recipe`: 0 for
// the inference recipes (mxfp4, nvfp4), which keep none.
std::size_t sm90_device_saved_bytes(const AttentionShape& shape, Recipe recipe, PackedTokens packed = {});

// Byte offset inside that block of the smooth_k mean, fp32 (B, Hkv, D) (the
// gradient through the LSE needs it where K itself was not kept). Throws
// fp4attn::Error("recipe") for a recipe that keeps nothing.
std::size_t sm90_device_saved_k_mean_offset(const AttentionShape& shape, Recipe recipe, PackedTokens packed = {});

// Device bytes of DeviceForwardArgs::workspace for `shape` and `recipe`: the
// quantized operands, their scales and the quantizers' scratch (the MX
// recipes add their MXFP4 codes and the folded E4M3 operands, nvfp4 its
// NVFP4 codes and their BF16 expansion).
std::size_t sm90_device_workspace_bytes(const AttentionShape& shape, Recipe recipe = Recipe::fp8,
                                        PackedTokens packed = {});

// Forward on device pointers (recipes fp8, mxfp4_train, mxfp4, nvfp4), enqueued on
// `stream` (a cudaStream_t; null is the legacy default stream): the GPU
// quantizer(s), the MXFP4 fold for the MX recipes (the BF16 expansion for
// nvfp4), then the kernel. No
// allocation and no host synchronisation, so it may be captured in a CUDA
// graph. Validates shape and options (fp4attn::validate) and throws
// fp4attn::Error when the sm90 executor does not implement the call
// (sm90_supports), no Hopper GPU is present, or a pointer, stride or the
// workspace is unfit. Non-finite input cannot raise an error here (that
// would need a host synchronisation): it makes every element of O and LSE NaN.
void sm90_forward_device(const DeviceForwardArgs& args, const AttentionOptions& opt, void* stream);

// ---- Backward on tensors already on the device (recipes fp8 and mxfp4_train, DESIGN §5).

struct DeviceBackwardArgs {
  AttentionShape shape;
  DeviceElement element = DeviceElement::bf16;  // of q, k, v, o, d_o, dq, dk, dv
  DeviceTensorView q, k, v;  // the forward's inputs: (B, Sq, Hq, D), (B, Sk, Hkv, D), (B, Sk, Hkv, D)
  DeviceTensorView o, d_o;   // the forward's output and its gradient, (B, Sq, Hq, D)
  const float* lse = nullptr;  // (B, Hq, Sq) contiguous, natural log, as the forward returns it
  void* dq = nullptr;          // (B, Sq, Hq, D), element strides below
  std::int64_t dq_stride_b = 0, dq_stride_s = 0, dq_stride_h = 0;
  void* dk = nullptr;  // (B, Sk, Hkv, D), summed over each group of query heads
  std::int64_t dk_stride_b = 0, dk_stride_s = 0, dk_stride_h = 0;
  void* dv = nullptr;  // (B, Sk, Hkv, D)
  std::int64_t dv_stride_b = 0, dv_stride_s = 0, dv_stride_h = 0;
  // Scratch of at least sm90_device_backward_workspace_bytes(shape, deterministic, recipe,
  // saved != nullptr, packed tokens) device bytes, any content, 256-byte aligned; used by one
  // call at a time.
  void* workspace = nullptr;
  std::size_t workspace_bytes = 0;
  // Optional: the block a forward on the same q, k, v, shape and options
  // filled (DeviceForwardArgs::saved). The backward then takes Q's and K's
  // operands from it instead of quantizing q and k (whose views then serve
  // only the shape checks); the gradients are bit for bit the same. Read
  // only: one saved block serves any number of backward calls.
  const void* saved = nullptr;
  std::size_t saved_bytes = 0;
  // Optional, recipe fp8: packed sequences, as in
  // DeviceForwardArgs (shape.Sq, shape.Sk the longest; q, o, d_o and dq
  // rows from cu_seqlens_q, k, v, dk and dv rows from cu_seqlens_k, batch
  // strides not used; the LSE (Hq, lse_pitch) as that forward returns it;
  // k_tokens the key tokens in all; cu_seqlens checked on the device as
  // there, dq, dk and dv NaN where they do not fit).
  // Each sequence's gradients are those of a call on it alone, bit for bit
  // (deterministic; the one pass sums dQ in its own varying order).
  const int* cu_seqlens_q = nullptr;
  const int* cu_seqlens_k = nullptr;
  std::int64_t lse_pitch = 0;
  std::int64_t k_tokens = 0;
};

// Device bytes of DeviceBackwardArgs::workspace for `shape` and `recipe` (fp8
// or mxfp4_train): the quantized operands (Q, K as the forward, used unless
// `saved` is given; dO, V per token block), their transposed copies, scales,
// row statistics, for
// mxfp4_train the MXFP4 codes of Q and K, and, for `deterministic = false`
// only, the fp32 sums of dQ (4·Hq·D bytes per query, Sq padded to 128, per
// batch entry). `kept`: for calls given the forward's `saved` block, whose
// operands the workspace then leaves out (2 bytes per Q and K element less).
std::size_t sm90_device_backward_workspace_bytes(const AttentionShape& shape, bool deterministic,
                                                 Recipe recipe = Recipe::fp8, bool kept = false,
                                                 PackedTokens packed = {});

// Mean number of keys a query row sees under `mask` (the pairs each row
// forms); 0 for Sq = 0.
double mean_visible_keys(MaskKind mask, std::int64_t Sq, std::int64_t Sk, Window window = {});

// Whether the one-pass backward (`deterministic = false`: the dK/dV kernel
// also sums dQ, in an order that varies run to run) is faster than the two
// deterministic passes for this problem. Measured on the H200 (forward +
// backward, src/cuda/sm90/bwd/NOTES.md): at D = 64 it is where a query row
// sees at least 256 keys on average (P and dS formed once per pair instead
// of twice: +3 % at S = 512 causal, +5 % at 1k causal and 512 noncausal,
// +9 % at 1k noncausal, +11 % at 4k causal; shorter rows not measured); at
// D = 128 it is not (−2 to −8 % at S = 1k–16k: staging the 64 KB of fp32
// dQ per pair costs more than the second pass). Callers
// that need no reproducible bits pass deterministic =
// !sm90_backward_one_pass_faster(shape, mask).
bool sm90_backward_one_pass_faster(const AttentionShape& shape, MaskKind mask, Window window = {});

// The same for packed sequences of these query and key lengths (one pair per
// sequence): the mean over all query rows of the keys each sees.
bool sm90_packed_backward_one_pass_faster(const std::vector<std::int64_t>& lens_q,
                                          const std::vector<std::int64_t>& lens_k, std::int64_t D, MaskKind mask,
                                          Window window = {});

// Backward on device pointers (recipes fp8 and mxfp4_train), enqueued on
// `stream`: the GPU quantizer (Q, K, smooth_k as the forward, unless `saved`
// holds the forward's; dO and V per 128-token block, with dOᵀ and delta =
// rowsum(dO ⊙ O); mxfp4_train: Q and K by the MXFP4 quantizer, folded into
// E4M3 with one power of two per 128-token tile), the LSE rows, then the dQ
// and dK/dV kernels. No allocation and no host
// synchronisation. Non-finite input cannot raise an error here (that would
// need a host synchronisation): a non-finite q, k, v or d_o makes the
// gradients NaN (sm90::bwd::nan_scales_if_flagged). Throws
// fp4attn::Error naming the argument for invalid shapes or options, calls the
// sm90 backward does not implement, null pointers and an unfit workspace.
// `deterministic` runs two passes, each gradient written once: bit-identical
// results run to run. `deterministic = false` runs one pass that adds dQ to
// fp32 sums by bulk reductions (dQ's last bits vary run to run, and its dS
// takes one scale per pair where the two passes take one per 64 query rows:
// AttentionOptions::dq_ds_rows models either; faster at D = 64, slower at
// D = 128: sm90_backward_one_pass_faster, src/cuda/sm90/bwd/NOTES.md).
void sm90_backward_device(const DeviceBackwardArgs& args, const AttentionOptions& opt, bool deterministic,
                          void* stream);

// Whether the sm90 backward implements this validated problem (sm90_supports
// plus a recipe with a backward on the GPU and E4M3 dS).
bool sm90_backward_supports(const AttentionShape& shape, const AttentionOptions& opt);

// Backward on host arrays through the device path (f32 on the GPU); the caller
// has validated everything (fp4attn::backward).
BackwardOutput sm90_backward(const AttentionShape& shape, std::span<const float> q, std::span<const float> k,
                             std::span<const float> v, std::span<const float> o, std::span<const float> lse,
                             std::span<const float> d_o, const AttentionOptions& opt);

}  // namespace fp4attn::dispatch
