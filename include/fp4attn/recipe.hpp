// Recipes (DESIGN §2): the precision of every operand, chosen by name.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace fp4attn {

enum class Recipe : std::uint8_t { fp8, mxfp4, nvfp4, mxfp4_train };

// How an operand is stored in memory.
enum class TensorFormat : std::uint8_t {
  fp8_e4m3,  // E4M3 bytes, fp32 scale per block (token block for Q/K, channel for V)
  mxfp4,     // E2M1 + E8M0 per 32 along the reduction dimension
  nvfp4,     // E2M1 + UE4M3 per 16 along the reduction dimension + fp32 per tensor
};

// Which hardware's numerics the emulator reproduces.
enum class Target : std::uint8_t {
  sm90,   // Hopper: FP8 wgmma; FP4 expanded to E4M3 with a per-row power of two (DESIGN §3.4)
  sm100,  // Blackwell: ideal block-scaled FP4 product
};

enum class MxScaleRule : std::uint8_t {
  round_up,   // X = 2^ceil(log2(amax/6)): never clips the block maximum (default)
  ocp_floor,  // X = 2^(floor(log2 amax) - 2): OCP MX v1.0, clips up to 25 %
};

enum class GradFormat : std::uint8_t { e4m3, e5m2 };

// How the emulator sums the products of each tensor-core instruction.
enum class Accumulation : std::uint8_t {
  tensor_core,  // as the target's tensor core does where that is modelled: sm90 FP8 wgmma keeps
                // 14 significant bits per k32 step (docs/numerics.md); fp32 for everything else
  fp32,         // exact products summed in fp32: an idealized tensor core
};

enum class MaskKind : std::uint8_t {
  none,
  causal,           // bottom-right aligned: query i sees key j iff j <= i + (Sk - Sq) (FlashAttention >= 2.1)
  causal_top_left,  // query i sees key j iff j <= i (PyTorch SDPA's is_causal)
};

// Sliding-window (local) attention, FlashAttention's window_size. With d the
// mask's diagonal offset (Sk - Sq, or 0 for causal_top_left), query i sees
// key j only if i + d - left <= j <= i + d + right. A negative bound is no
// bound. A causal mask ends every row at its diagonal already, so with one
// `right` can only be -1 or 0.
struct Window {
  std::int64_t left = -1;
  std::int64_t right = -1;
  constexpr bool bounded() const { return left >= 0 || right >= 0; }
};

// The keys [first, end) one query row sees; first == end for a row that sees none.
struct KeyRange {
  std::int64_t first = 0;
  std::int64_t end = 0;
  constexpr std::int64_t size() const { return end - first; }
};

// Both bounds grow with i, so the keys of rows i0..i1 together lie in
// [range(i0).first, range(i1).end), which is what the kernels' tile loops walk.
constexpr KeyRange visible_keys(MaskKind mask, Window window, std::int64_t Sq, std::int64_t Sk, std::int64_t i) {
  const std::int64_t d = mask == MaskKind::causal_top_left ? 0 : Sk - Sq;
  std::int64_t first = 0, end = Sk;
  if (mask != MaskKind::none) end = i + d + 1;
  else if (window.right >= 0) end = i + d + window.right + 1;
  if (window.left >= 0) first = i + d - window.left;
  first = first < 0 ? 0 : first > Sk ? Sk : first;
  end = end < first ? first : end > Sk ? Sk : end;
  return {first, end};
}

struct RecipeSpec {
  TensorFormat qk;
  TensorFormat v;
  TensorFormat p;
  bool has_backward;
};

constexpr RecipeSpec spec_of(Recipe r) {
  switch (r) {
    case Recipe::fp8: return {TensorFormat::fp8_e4m3, TensorFormat::fp8_e4m3, TensorFormat::fp8_e4m3, true};
    case Recipe::mxfp4: return {TensorFormat::mxfp4, TensorFormat::mxfp4, TensorFormat::mxfp4, false};
    case Recipe::nvfp4: return {TensorFormat::nvfp4, TensorFormat::nvfp4, TensorFormat::nvfp4, false};
    case Recipe::mxfp4_train: return {TensorFormat::mxfp4, TensorFormat::fp8_e4m3, TensorFormat::fp8_e4m3, true};
  }
  return {TensorFormat::fp8_e4m3, TensorFormat::fp8_e4m3, TensorFormat::fp8_e4m3, false};
}

inline constexpr Recipe kAllRecipes[] = {Recipe::fp8, Recipe::mxfp4, Recipe::nvfp4, Recipe::mxfp4_train};

constexpr std::string_view to_string(Recipe r) {
  switch (r) {
    case Recipe::fp8: return "fp8";
    case Recipe::mxfp4: return "mxfp4";
    case Recipe::nvfp4: return "nvfp4";
    case Recipe::mxfp4_train: return "mxfp4_train";
  }
  return "?";
}
constexpr std::string_view to_string(Target t) { return t == Target::sm90 ? "sm90" : "sm100"; }
constexpr std::string_view to_string(Accumulation a) { return a == Accumulation::tensor_core ? "tensor_core" : "fp32"; }
constexpr std::string_view to_string(TensorFormat f) {
  switch (f) {
    case TensorFormat::fp8_e4m3: return "fp8_e4m3";
    case TensorFormat::mxfp4: return "mxfp4";
    case TensorFormat::nvfp4: return "nvfp4";
  }
  return "?";
}

inline std::optional<Recipe> parse_recipe(std::string_view name) {
  for (Recipe r : kAllRecipes)
    if (to_string(r) == name) return r;
  return std::nullopt;
}
inline std::optional<Target> parse_target(std::string_view name) {
  if (name == "sm90") return Target::sm90;
  if (name == "sm100") return Target::sm100;
  return std::nullopt;
}

// Options every recipe accepts (DESIGN §2).
struct AttentionOptions {
  Recipe recipe = Recipe::fp8;
  MaskKind mask = MaskKind::none;
  Window window;               // none by default
  float softmax_scale = 0.0f;  // 0 means 1/sqrt(D)
  bool smooth_k = true;
  bool direct_p = true;
  Target target = Target::sm90;
  MxScaleRule mx_scale_rule = MxScaleRule::round_up;
  GradFormat ds_format = GradFormat::e4m3;
  Accumulation accumulation = Accumulation::tensor_core;  // emulator only; the kernels are the hardware
  int block_q = 128;  // query tile of the kernel; also the FP8 Q scale block
  int block_k = 128;  // key tile of the kernel; also the FP8 K scale block
  // Query rows of one dS scale block in dQ = dS·K (emulator only; the kernels
  // are the hardware): 64, one consumer warpgroup of the sm90 dQ kernel (the
  // deterministic backward); block_q for the one-pass backward, whose dS codes
  // serve dK and dQ alike. dK's dSᵀ always takes one scale per (query tile,
  // key tile) pair. A block is never taller than block_q.
  int dq_ds_rows = 64;
  int threads = 0;    // CPU emulator worker threads; 0 means all cores
};

}  // namespace fp4attn
