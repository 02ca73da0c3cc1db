#include "dispatch/head_dim_padding.hpp"

#include "emulator/numerics.hpp"
#include "fp4attn/attention.hpp"

namespace fp4attn::dispatch {

std::int64_t sm90_head_dim_for(std::int64_t d) {
  for (int w : kSm90HeadDims)  // ascending
    if (d <= w) return w;
  return d <= kSm90Fp8ForwardMaxHeadDim ? kSm90Fp8ForwardMaxHeadDim : 0;
}

AttentionShape with_head_dim(const AttentionShape& shape, std::int64_t d_to) {
  AttentionShape s = shape;
  s.D = d_to;
  return s;
}

AttentionOptions with_scale_of(const AttentionOptions& opt, std::int64_t d) {
  AttentionOptions o = opt;
  o.softmax_scale = emulator::resolve_softmax_scale(opt.softmax_scale, d);  // the kernels' default too
  return o;
}

}  // namespace fp4attn::dispatch
