#include "emulator/checks.hpp"

#include <cmath>
#include <string>

#include "emulator/p_row.hpp"
#include "fp4attn/error.hpp"
#include "fp4attn/quantize.hpp"

namespace fp4attn::emulator {
namespace {

void require_positive(std::int64_t value, const char* name) {
  if (value <= 0) throw Error(name, "must be positive, got " + std::to_string(value));
}

}  // namespace

void check_problem(const AttentionShape& shape, const AttentionOptions& opt) {
  require_positive(shape.B, "B");
  require_positive(shape.Hq, "Hq");
  require_positive(shape.Hkv, "Hkv");
  require_positive(shape.Sq, "Sq");
  require_positive(shape.Sk, "Sk");
  require_positive(shape.D, "D");
  if (shape.Hq % shape.Hkv != 0)
    throw Error("Hq", "must be a multiple of Hkv (" + std::to_string(shape.Hq) + " vs " + std::to_string(shape.Hkv) + ")");
  require_positive(opt.block_q, "block_q");
  require_positive(opt.block_k, "block_k");
  // P's scale blocks (32 keys for MXFP4, 16 for NVFP4) must never straddle
  // two key tiles, and MXFP4 V's 32-token blocks must align with them.
  if (opt.block_k % kMxfp4Block != 0 || opt.block_k > kMaxBlockK)
    throw Error("block_k", "must be a multiple of " + std::to_string(kMxfp4Block) + " and at most " +
                               std::to_string(kMaxBlockK) + ", got " + std::to_string(opt.block_k));
  if (!std::isfinite(opt.softmax_scale) || opt.softmax_scale < 0.0f)
    throw Error("softmax_scale", "must be finite and non-negative (0 means 1/sqrt(D))");
}

void check_size(std::size_t actual, std::int64_t expected, const char* name) {
  if (static_cast<std::int64_t>(actual) != expected)
    throw Error(name, "has " + std::to_string(actual) + " elements, the shape needs " + std::to_string(expected));
}

}  // namespace fp4attn::emulator
