// forward_e4m3: recipe fp8's forward on caller-quantized E4M3 inputs. The
// checks live here once; the emulator runs the codes as the kernels' operands
// (the descales broadcast into their block and channel scales), the sm90
// executor through its device entry point.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "dispatch/sm90_executor.hpp"
#include "fp4attn/attention.hpp"
#include "fp4attn/emulator.hpp"
#include "fp4attn/error.hpp"

namespace fp4attn {
namespace {

constexpr std::int64_t kE4m3HeadDimStep = 16;  // the kernels read Q's and K's code rows by TMA: 16-byte strides
constexpr std::int64_t kEmulatorChannelBlock = 32;  // the emulator's operands run whole blocks of channels

bool is_nan_code(std::uint8_t c) { return (c & 0x7F) == 0x7F; }

void check_codes(std::span<const std::uint8_t> x, std::size_t expected, std::int64_t S, std::int64_t H,
                 std::int64_t D, const char* name) {
  if (x.size() != expected)
    throw Error(name, "has " + std::to_string(x.size()) + " codes, expected " + std::to_string(expected));
  for (std::size_t i = 0; i < x.size(); ++i) {
    if (!is_nan_code(x[i])) continue;
    const auto idx = static_cast<std::int64_t>(i);
    const std::int64_t d = idx % D, h = idx / D % H, s = idx / (D * H) % S, b = idx / (D * H * S);
    throw Error(name, "holds a NaN code (0x" + std::string(x[i] == 0xFF ? "FF" : "7F") + ") at (b, s, h, d) = (" +
                          std::to_string(b) + ", " + std::to_string(s) + ", " + std::to_string(h) + ", " +
                          std::to_string(d) + ")");
  }
}

void check_descale(std::span<const float> x, const AttentionShape& shape, const char* name) {
  if (x.empty()) return;
  if (static_cast<std::int64_t>(x.size()) != shape.B * shape.Hkv)
    throw Error(name, "has " + std::to_string(x.size()) + " values, expected (B, Hkv) = " +
                          std::to_string(shape.B * shape.Hkv));
  for (std::size_t i = 0; i < x.size(); ++i)
    if (!(std::isfinite(x[i]) && x[i] > 0.0f))
      throw Error(name, "must be finite and positive, got " + std::to_string(x[i]) + " at (b, h) = (" +
                            std::to_string(static_cast<std::int64_t>(i) / shape.Hkv) + ", " +
                            std::to_string(static_cast<std::int64_t>(i) % shape.Hkv) + ")");
}

// One descale per (b, kv head), 1 when none was given.
float descale_at(std::span<const float> x, std::int64_t b, std::int64_t hkv, std::int64_t Hkv) {
  return x.empty() ? 1.0f : x[static_cast<std::size_t>(b * Hkv + hkv)];
}

// Codes (B, S, H, D) with zero codes appended to every row up to d_to channels.
std::vector<std::uint8_t> padded_codes(std::span<const std::uint8_t> x, std::int64_t D, std::int64_t d_to) {
  if (d_to == D) return {x.begin(), x.end()};
  const std::int64_t rows = static_cast<std::int64_t>(x.size()) / D;
  std::vector<std::uint8_t> out(static_cast<std::size_t>(rows * d_to), 0);
  for (std::int64_t r = 0; r < rows; ++r)
    std::copy_n(x.begin() + r * D, D, out.begin() + r * d_to);
  return out;
}

// The codes as the emulator's operands: Q and K in token blocks of the
// kernel's tiles, V with one scale per channel, every scale its tensor's
// descale (a group's query heads share their kv head's).
emulator::QuantizedInputs emulator_operands(const AttentionShape& shape, std::int64_t d_run, const E4m3Inputs& in,
                                            const AttentionOptions& opt) {
  const std::int64_t group = shape.Hq / shape.Hkv;
  const auto tensor = [&](std::span<const std::uint8_t> codes, std::int64_t S, std::int64_t H, BlockAxis axis,
                          int block) {
    QuantizedTensor t;
    t.format = TensorFormat::fp8_e4m3;
    t.axis = axis;
    t.B = shape.B, t.S = S, t.H = H, t.D = d_run;
    t.block = block;
    t.codes = padded_codes(codes, shape.D, d_run);
    return t;
  };
  emulator::QuantizedInputs q;
  q.q = tensor(in.q, shape.Sq, shape.Hq, BlockAxis::along_d, opt.block_q);
  q.k = tensor(in.k, shape.Sk, shape.Hkv, BlockAxis::along_d, opt.block_k);
  q.v = tensor(in.v, shape.Sk, shape.Hkv, BlockAxis::along_s,
               static_cast<int>(std::min<std::int64_t>(shape.Sk, std::numeric_limits<int>::max())));
  const std::int64_t q_blocks = (shape.Sq + opt.block_q - 1) / opt.block_q;
  const std::int64_t k_blocks = (shape.Sk + opt.block_k - 1) / opt.block_k;
  for (std::int64_t b = 0; b < shape.B; ++b) {
    for (std::int64_t h = 0; h < shape.Hq; ++h)
      q.q.scales.insert(q.q.scales.end(), q_blocks, descale_at(in.q_descale, b, h / group, shape.Hkv));
    for (std::int64_t h = 0; h < shape.Hkv; ++h) {
      q.k.scales.insert(q.k.scales.end(), k_blocks, descale_at(in.k_descale, b, h, shape.Hkv));
      // Channels past D (zero codes) keep a scale of 1.
      q.v.scales.insert(q.v.scales.end(), shape.D, descale_at(in.v_descale, b, h, shape.Hkv));
      q.v.scales.insert(q.v.scales.end(), d_run - shape.D, 1.0f);
    }
  }
  return q;
}

ForwardOutput run_emulator(const AttentionShape& shape, const E4m3Inputs& in, const AttentionOptions& opt) {
  const std::int64_t d_run = (shape.D + kEmulatorChannelBlock - 1) / kEmulatorChannelBlock * kEmulatorChannelBlock;
  AttentionShape run = shape;
  run.D = d_run;
  AttentionOptions run_opt = opt;
  // The softmax scale belongs to the call's head dim, not the padded one.
  if (run_opt.softmax_scale == 0.0f) run_opt.softmax_scale = 1.0f / std::sqrt(static_cast<float>(shape.D));
  emulator::ForwardResult r = emulator::forward(run, emulator_operands(shape, d_run, in, opt), run_opt);
  return ForwardOutput{first_channels(r.o, d_run, shape.D), std::move(r.lse), Executor::emulator};
}

}  // namespace

bool sm90_runs_e4m3(const AttentionShape& shape, const AttentionOptions& opt) {
  return sm90_available() && dispatch::sm90_grid_holds(shape) && opt.target == Target::sm90 && opt.block_q == 128 &&
         opt.block_k == 128;
}

void validate_e4m3(const AttentionShape& shape, const AttentionOptions& opt) {
  validate(shape, opt);
  if (opt.recipe != Recipe::fp8)
    throw Error("recipe", "E4M3 inputs run recipe fp8 (its operands are E4M3), not " +
                              std::string(to_string(opt.recipe)));
  if (opt.smooth_k)
    throw Error("smooth_k", "must be off for E4M3 inputs: smoothing subtracts K's mean before K is quantized");
  if (shape.D % kE4m3HeadDimStep != 0 || shape.D < kE4m3HeadDimStep)
    throw Error("D", "E4M3 inputs need a head dim that is a multiple of " + std::to_string(kE4m3HeadDimStep) +
                         " (16-byte code rows), got " + std::to_string(shape.D));
}

ForwardOutput forward_e4m3(const AttentionShape& shape, const E4m3Inputs& in, const AttentionOptions& opt,
                           Executor executor) {
  validate_e4m3(shape, opt);
  check_codes(in.q, static_cast<std::size_t>(shape.q_elems()), shape.Sq, shape.Hq, shape.D, "q");
  check_codes(in.k, static_cast<std::size_t>(shape.kv_elems()), shape.Sk, shape.Hkv, shape.D, "k");
  check_codes(in.v, static_cast<std::size_t>(shape.kv_elems()), shape.Sk, shape.Hkv, shape.D, "v");
  check_descale(in.q_descale, shape, "q_descale");
  check_descale(in.k_descale, shape, "k_descale");
  check_descale(in.v_descale, shape, "v_descale");
  switch (executor) {
    case Executor::automatic:
      if (sm90_runs_e4m3(shape, opt)) return dispatch::sm90_forward_e4m3(shape, in, opt);
      return run_emulator(shape, in, opt);
    case Executor::sm90:
      if (opt.target != Target::sm90)
        throw Error("executor", "the sm90 executor cannot run target " + std::string(to_string(opt.target)));
      if (!cuda_built()) throw Error("executor", "this build has no CUDA executors");
      if (!sm90_available()) throw Error("executor", "no compute-capability 9.0 GPU found");
      return dispatch::sm90_forward_e4m3(shape, in, opt);
    case Executor::emulator: return run_emulator(shape, in, opt);
  }
  throw Error("executor", "unknown executor");
}

}  // namespace fp4attn
