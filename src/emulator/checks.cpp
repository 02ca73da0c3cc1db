#include "emulator/checks.hpp"

#include <cmath>
#include <string>

#include "emulator/numerics.hpp"
#include "emulator/p_row.hpp"
#include "fp4attn/error.hpp"
#include "fp4attn/quantize.hpp"

namespace fp4attn::emulator {

void check_problem(const AttentionShape& shape, const AttentionOptions& opt) {
  check_shape(shape);
  if (opt.block_q <= 0) throw Error("block_q", "must be positive, got " + std::to_string(opt.block_q));
  // P's scale blocks (32 keys for MXFP4, 16 for NVFP4) must never straddle
  // two key tiles, and MXFP4 V's 32-token blocks must align with them.
  if (opt.block_k <= 0 || opt.block_k % kMxfp4Block != 0 || opt.block_k > kMaxBlockK)
    throw Error("block_k", "must be a multiple of " + std::to_string(kMxfp4Block) + " and at most " +
                               std::to_string(kMaxBlockK) + ", got " + std::to_string(opt.block_k));
  if (opt.dq_ds_rows <= 0) throw Error("dq_ds_rows", "must be positive, got " + std::to_string(opt.dq_ds_rows));
  if (!std::isfinite(opt.softmax_scale) || opt.softmax_scale < 0.0f)
    throw Error("softmax_scale", "must be finite and non-negative (0 means 1/sqrt(D))");
  check_window(opt.mask, opt.window);
}

ChannelPadded channel_padded(const AttentionShape& shape, const AttentionOptions& opt, std::span<const float> q,
                             std::span<const float> k, std::span<const float> v) {
  check_shape(shape);
  check_element_count(q.size(), shape.q_elems(), "q");
  check_element_count(k.size(), shape.kv_elems(), "k");
  check_element_count(v.size(), shape.kv_elems(), "v");
  ChannelPadded p{shape, opt};
  p.shape.D = (shape.D + kChannelBlock - 1) / kChannelBlock * kChannelBlock;
  p.opt.softmax_scale = resolve_softmax_scale(opt.softmax_scale, shape.D);
  return p;
}

}  // namespace fp4attn::emulator
