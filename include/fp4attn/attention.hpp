// Public entry points: attention on host arrays, run by the best executor
// available (the sm90 kernels on a Hopper GPU, else the CPU emulator).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "fp4attn/recipe.hpp"
#include "fp4attn/tensor.hpp"

namespace fp4attn {

enum class Executor : std::uint8_t { automatic, emulator, sm90 };

constexpr std::string_view to_string(Executor e) {
  switch (e) {
    case Executor::automatic: return "automatic";
    case Executor::emulator: return "emulator";
    case Executor::sm90: return "sm90";
  }
  return "?";
}

struct ForwardOutput {
  std::vector<float> o;    // (B, Sq, Hq, D), bf16-rounded values
  std::vector<float> lse;  // (B, Hq, Sq), natural log
  Executor executor = Executor::emulator;
};

// Throws fp4attn::Error naming the bad argument (shape, heads, head dim,
// options). Called once by every entry point; kernels and bindings trust it.
void validate(const AttentionShape& shape, const AttentionOptions& opt);

// Throws fp4attn::Error when q, k or v has the wrong element count for `shape`.
void validate_sizes(const AttentionShape& shape, std::size_t q_size, std::size_t k_size, std::size_t v_size);

// Head dims: any multiple of 8 in [8, 256], as FlashAttention takes (40 and
// 72 occur in diffusion models). The emulator runs one that is no multiple of
// 32 (its scale blocks' width) with zero channels appended up to one; the
// sm90 kernels are instantiated for kSm90HeadDims, and run other head dims
// with zero channels too (sm90_supports, sm90_runs): recipe fp8's forward in
// place from kSm90InPlaceMinHeadDim (the FP8 quantizer's narrowest lanes),
// everything else through copies.
inline constexpr int kHeadDimStep = 8;
inline constexpr int kMinHeadDim = 8;
inline constexpr int kSm90InPlaceMinHeadDim = 16;
inline constexpr int kMaxHeadDim = 256;
inline constexpr int kSm90HeadDims[] = {64, 128};
// The forward's FP8 kernel also has a D = 256 instance: recipe fp8 reads the
// head dims above 128 on it, the MX recipes (folded into E4M3) run D = 256
// and the others above 128 with zero channels appended; nvfp4 and the
// backward stay on the emulator above 128.
inline constexpr int kSm90Fp8ForwardMaxHeadDim = 256;
bool emulator_supports_head_dim(std::int64_t d);
// Whether the sm90 executor's forward implements this (already validated)
// problem as it is: its target, recipe, tile sizes and head dim (the kernels'
// own, 256 for recipes fp8, mxfp4 and mxfp4_train, and for recipe fp8 every other one up
// to kSm90Fp8ForwardMaxHeadDim, read with zero channels added).
bool sm90_supports(const AttentionShape& shape, const AttentionOptions& opt);
// Whether d is a head dim the sm90 kernels are instantiated for (kSm90HeadDims).
bool sm90_kernel_head_dim(std::int64_t d);
// Whether forward's automatic choice runs this (validated) problem on the sm90
// kernels: a Hopper GPU is present and they implement it, where sm90_supports
// does not, a head dim they lack (16, 32, 48, 80, 96, 112; 144 … 240 for
// the MX recipes) with zero channels appended to the inputs up to the next one they have;
// and one call's grids hold the batch and the query heads (at most 65535 each).
bool sm90_runs(const AttentionShape& shape, const AttentionOptions& opt);

// True when this library was built with the CUDA executors.
bool cuda_built();
// True when this build has the sm90 executor and a compute-capability 9.0 GPU is present.
bool sm90_available();
// One line on the device (or its absence) for `fp4attn info` and `fp4attn run`.
std::string device_description();

ForwardOutput forward(const AttentionShape& shape, std::span<const float> q, std::span<const float> k,
                      std::span<const float> v, const AttentionOptions& opt, Executor executor = Executor::automatic);

// Recipe fp8's forward on inputs the caller has already quantized to E4M3, as
// FlashAttention-3's FP8 interface takes them: one OCP E4M3 code per element
// ((B, S, H, D), contiguous) and, per tensor, one fp32 descale per (batch
// entry, kv head), (B, Hkv); the value of a code is code × descale. An empty
// descale means 1. The scores, Direct-P and the products are recipe fp8's:
// the kernels' block scales are the descales, V's channel scales too.
struct E4m3Inputs {
  std::span<const std::uint8_t> q, k, v;
  std::span<const float> q_descale, k_descale, v_descale;
};

// Throws fp4attn::Error naming the argument: validate's checks, then recipe
// fp8, smooth_k off (K is smoothed before it is quantized), D a multiple of 16.
void validate_e4m3(const AttentionShape& shape, const AttentionOptions& opt);

// Whether forward_e4m3's automatic choice runs this (validated) call on the
// sm90 kernels: a Hopper GPU, target sm90, 128-token tiles, the grid limits.
bool sm90_runs_e4m3(const AttentionShape& shape, const AttentionOptions& opt);

// Automatic executor: the sm90 kernels when present and the call is theirs
// (target sm90, 128-token tiles, the grid limits), else the CPU emulator,
// which models them bit for bit. Throws fp4attn::Error naming the argument for
// sizes, a NaN code (E4M3 0x7F / 0xFF) or a descale that is not finite and positive.
ForwardOutput forward_e4m3(const AttentionShape& shape, const E4m3Inputs& in, const AttentionOptions& opt,
                           Executor executor = Executor::automatic);

struct BackwardOutput {
  std::vector<float> dq;  // (B, Sq, Hq, D)
  std::vector<float> dk;  // (B, Sk, Hkv, D), summed over each group of query heads
  std::vector<float> dv;  // (B, Sk, Hkv, D)
  Executor executor = Executor::emulator;
};

// FP8 backward (recipes with a backward: fp8, mxfp4_train; DESIGN §5) from the
// forward's inputs q, k, v, its output o and LSE (B, Hq, Sq, natural log; -inf
// for rows that see no key), and the output gradient d_o (B, Sq, Hq, D).
// Automatic: the sm90 kernels when present and implemented (recipes fp8 and
// mxfp4_train, target sm90), else the CPU emulator. Throws fp4attn::Error
// naming the bad argument.
BackwardOutput backward(const AttentionShape& shape, std::span<const float> q, std::span<const float> k,
                        std::span<const float> v, std::span<const float> o, std::span<const float> lse,
                        std::span<const float> d_o, const AttentionOptions& opt,
                        Executor executor = Executor::automatic);

// Device timing of the sm90 fp8 forward (DESIGN §8), behind `fp4attn bench`,
// and of the training path.
enum class TimedOp : std::uint8_t {
  fwd,      // the kernel on pre-quantized E4M3 inputs
  fwd_e2e,  // GPU quantization from bf16 inputs, then the kernel
  fwdbwd,   // training: forward from bf16 keeping Q's and K's operands, then the backward from bf16 dO
  bwd,      // the backward alone (on the forward's kept operands), bf16 gradients
  // caller-quantized E4M3 inputs with per-head descales (forward_e4m3's device
  // entry): the preparation pass (scales, Vᵀ, NaN scan), then the kernel
  fwd_e4m3,
};

constexpr std::string_view to_string(TimedOp op) {
  switch (op) {
    case TimedOp::fwd: return "fwd";
    case TimedOp::fwd_e2e: return "fwd_e2e";
    case TimedOp::fwdbwd: return "fwdbwd";
    case TimedOp::bwd: return "bwd";
    case TimedOp::fwd_e4m3: return "fwd_e4m3";
  }
  return "?";
}

// FLOPs of an op as a multiple of the forward's (the backward's five products against two).
constexpr double flop_factor(TimedOp op) {
  return op == TimedOp::fwdbwd ? 3.5 : op == TimedOp::bwd ? 2.5 : 1.0;
}

struct BenchOptions {
  MaskKind mask = MaskKind::none;
  Window window{};  // a sliding window, as AttentionOptions::window (none by default)
  int reps = 20;   // timed runs; the median is reported
  int warmup = 5;  // untimed runs first (clocks, caches, module loading)
  bool training = false;  // also time fwdbwd and bwd (the backward's faster mode for D, as torch picks it)
};

struct Timing {
  TimedOp op = TimedOp::fwd;
  bool direct_p = true;
  double ms = 0.0;  // median over BenchOptions::reps
};

struct Sm90Benchmark {
  std::string gpu;              // the device's name
  int input_sets = 0;           // inputs rotated through, so that no run finds its inputs in L2
  double rotated_bytes = 0.0;   // E4M3 operand bytes of all input sets together
  // fwd, fwd_e2e, fwd_e4m3 (where D is a multiple of 16; and with training
  // fwdbwd, bwd), each Direct-P on, then off
  std::vector<Timing> timings;
  // The training rows' backward: true the two deterministic passes, false the
  // one pass (dQ summed in an order that varies run to run, its dS with one
  // scale per 128 × 128 pair where the two passes take one per 64 query rows;
  // faster at D = 64).
  bool deterministic_backward = true;
};

// Times recipe fp8 (default options otherwise) on random normal bf16 inputs
// made on the GPU, with CUDA events. Throws fp4attn::Error naming the argument
// for a shape the sm90 executor does not implement, for reps < 1 or
// warmup < 0, and naming "executor" when no Hopper GPU is usable: the CPU
// emulator is not benchmarked.
Sm90Benchmark benchmark_sm90(const AttentionShape& shape, const BenchOptions& opt);

}  // namespace fp4attn
