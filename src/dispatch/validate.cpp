// Argument checks shared by every entry point (DESIGN §6: validation lives in
// dispatch, kernels and bindings trust it). Each failure names the argument.
#include <algorithm>
#include <cmath>
#include <iterator>
#include <string>

#include "fp4attn/attention.hpp"
#include "fp4attn/error.hpp"

namespace fp4attn {
namespace {

// Tile sizes are whole warps of keys/queries (32) and at most the largest
// tile the kernels' shared-memory budget allows.
constexpr int kTileStep = 32;
constexpr int kMinTile = 32;
constexpr int kMaxTile = 256;

// What the sm90 executor implements so far (its kernels grow recipe by
// recipe); automatic dispatch sends everything else to the emulator.
// mxfp4 and mxfp4_train: MXFP4 folded into E4M3 before the same kernel (DESIGN §3.4).
// nvfp4: NVFP4 expanded to BF16 for the BF16 wgmma kernel.
constexpr Recipe kSm90Recipes[] = {Recipe::fp8, Recipe::mxfp4, Recipe::mxfp4_train, Recipe::nvfp4};
// The kernel's query/key tile, which is also its FP8 scale block.
constexpr int kSm90Tile = 128;

// a * b, or an Error naming `what` when the product leaves int64.
std::int64_t checked_mul(std::int64_t a, std::int64_t b, const char* what) {
  std::int64_t r = 0;
  if (__builtin_mul_overflow(a, b, &r)) throw Error(what, "size overflows a 64-bit element count");
  return r;
}

void require_tile(int value, const char* name) {
  if (value < kMinTile || value > kMaxTile || value % kTileStep != 0)
    throw Error(name, std::to_string(value) + " is not supported: needs a multiple of " + std::to_string(kTileStep) +
                          " in [" + std::to_string(kMinTile) + ", " + std::to_string(kMaxTile) + "]");
}

}  // namespace

void validate(const AttentionShape& shape, const AttentionOptions& opt) {
  check_shape(shape);
  if (!emulator_supports_head_dim(shape.D))
    throw Error("D", "D=" + std::to_string(shape.D) + " is not supported: D must be a multiple of " +
                         std::to_string(kHeadDimStep) + " in [" + std::to_string(kMinHeadDim) + ", " +
                         std::to_string(kMaxHeadDim) + "]");
  // Element counts and the score matrix must be representable, or every
  // later index computation would wrap.
  const std::int64_t rows = checked_mul(checked_mul(shape.B, shape.Hq, "Hq"), shape.Sq, "Sq");
  checked_mul(rows, shape.D, "D");
  checked_mul(rows, shape.Sk, "Sk");
  checked_mul(checked_mul(checked_mul(shape.B, shape.Hkv, "Hkv"), shape.Sk, "Sk"), shape.D, "D");

  require_tile(opt.block_q, "block_q");
  require_tile(opt.block_k, "block_k");
  if (!std::isfinite(opt.softmax_scale) || opt.softmax_scale < 0.0f)
    throw Error("softmax_scale", "must be finite and >= 0 (0 means 1/sqrt(D)), got " +
                                     std::to_string(opt.softmax_scale));
  if (opt.threads < 0) throw Error("threads", "must be >= 0 (0 means all cores), got " + std::to_string(opt.threads));
  check_window(opt.mask, opt.window);
}

void validate_sizes(const AttentionShape& shape, std::size_t q_size, std::size_t k_size, std::size_t v_size) {
  const auto check = [](const char* name, std::size_t got, std::int64_t want, const char* layout) {
    if (got != static_cast<std::size_t>(want))
      throw Error(name, "has " + std::to_string(got) + " elements, shape " + layout + " needs " +
                            std::to_string(want));
  };
  check("q", q_size, shape.q_elems(), "(B, Sq, Hq, D)");
  check("k", k_size, shape.kv_elems(), "(B, Sk, Hkv, D)");
  check("v", v_size, shape.kv_elems(), "(B, Sk, Hkv, D)");
}

bool emulator_supports_head_dim(std::int64_t d) {
  return d >= kMinHeadDim && d <= kMaxHeadDim && d % kHeadDimStep == 0;
}

bool sm90_supports(const AttentionShape& shape, const AttentionOptions& opt) {
  if (opt.target != Target::sm90) return false;  // sm100 numerics exist only in the emulator
  if (std::find(std::begin(kSm90Recipes), std::end(kSm90Recipes), opt.recipe) == std::end(kSm90Recipes))
    return false;
  if (opt.block_q != kSm90Tile || opt.block_k != kSm90Tile) return false;
  if (sm90_kernel_head_dim(shape.D)) return true;
  // The MX recipes' fold into E4M3 feeds the same kernel at D = 256.
  const bool mx = opt.recipe == Recipe::mxfp4 || opt.recipe == Recipe::mxfp4_train;
  if (mx && shape.D == kSm90Fp8ForwardMaxHeadDim) return true;
  // Recipe fp8's forward also reads every other head dim from 16 up where
  // it is, its tensor maps filling the 64-, 128- or 256-wide kernel's missing
  // channels with zeros (fp8_direct_p/launch_head_dim.cuh); the 256-wide
  // kernel runs D = 136 … 256 (kSm90Fp8ForwardMaxHeadDim). The quantizer
  // writes the codes of an odd multiple of 8 in rows of the next multiple of
  // 16 bytes, a stride TMA can address.
  return opt.recipe == Recipe::fp8 && shape.D <= kSm90Fp8ForwardMaxHeadDim && shape.D >= kSm90InPlaceMinHeadDim;
}

bool sm90_kernel_head_dim(std::int64_t d) {
  return std::find(std::begin(kSm90HeadDims), std::end(kSm90HeadDims), d) != std::end(kSm90HeadDims);
}

}  // namespace fp4attn
