#include "dispatch/head_dim_padding.hpp"

#include <algorithm>
#include <cmath>

#include "fp4attn/attention.hpp"

namespace fp4attn::dispatch {

std::int64_t sm90_head_dim_for(std::int64_t d) {
  for (int w : kSm90HeadDims)  // ascending
    if (d <= w) return w;
  return 0;
}

AttentionShape with_head_dim(const AttentionShape& shape, std::int64_t d_to) {
  AttentionShape s = shape;
  s.D = d_to;
  return s;
}

AttentionOptions with_scale_of(const AttentionOptions& opt, std::int64_t d) {
  AttentionOptions o = opt;
  // The emulator's and the kernels' default, in float (resolve_softmax_scale).
  if (o.softmax_scale == 0.0f) o.softmax_scale = 1.0f / std::sqrt(static_cast<float>(d));
  return o;
}

std::vector<float> append_zero_channels(std::span<const float> x, std::int64_t d, std::int64_t d_to) {
  const std::size_t rows = x.size() / static_cast<std::size_t>(d);
  std::vector<float> out(rows * static_cast<std::size_t>(d_to), 0.0f);
  for (std::size_t r = 0; r < rows; ++r)
    std::copy_n(x.begin() + static_cast<std::ptrdiff_t>(r * d), d, out.begin() + static_cast<std::ptrdiff_t>(r * d_to));
  return out;
}

std::vector<float> first_channels(std::span<const float> x, std::int64_t d_from, std::int64_t d) {
  const std::size_t rows = x.size() / static_cast<std::size_t>(d_from);
  std::vector<float> out(rows * static_cast<std::size_t>(d));
  for (std::size_t r = 0; r < rows; ++r)
    std::copy_n(x.begin() + static_cast<std::ptrdiff_t>(r * d_from), d, out.begin() + static_cast<std::ptrdiff_t>(r * d));
  return out;
}

}  // namespace fp4attn::dispatch
