// Head dims the sm90 kernels lack, run on the next width they have.
//
// The kernels are instantiated for D = 64 and 128, the FP8 forward's also for
// 256 (recipes fp8, mxfp4 and mxfp4_train; sm90_supports says which call runs where).
// Zero channels appended to
// Q, K and V change no bit of O's first D columns or of the LSE in any recipe,
// and no bit of dQ's, dK's and dV's first D columns in the backward, as long
// as the softmax scale stays that of D (block amaxes and smooth_k's mean see
// zeros, Q·Kᵀ and dO·Vᵀ add exact zeros, the extra columns are dropped;
// EmulatorForward.ZeroChannelsChangeNoBit and the backward's twin check it).
// So D = 16, 32 and 48 run on the D = 64 kernels and 80, 96 and 112 on the
// D = 128 ones, at the wider kernel's cost (recipe fp8's forward without
// copies: sm90_supports).
#pragma once

#include <cstdint>

#include "fp4attn/recipe.hpp"
#include "fp4attn/tensor.hpp"

namespace fp4attn::dispatch {

// The sm90 kernels' head dim that runs head dim d: d itself, the smallest
// wider one (256 above 128: the FP8 forward's, which not every call has),
// or 0 when d is wider than all of them.
std::int64_t sm90_head_dim_for(std::int64_t d);

// The same problem with `d_to` channels.
AttentionShape with_head_dim(const AttentionShape& shape, std::int64_t d_to);

// The options with softmax_scale resolved against the unpadded D (0 means
// 1/sqrt(D), which the wider problem would read as 1/sqrt(d_to)).
AttentionOptions with_scale_of(const AttentionOptions& opt, std::int64_t d);

// append_zero_channels and first_channels (fp4attn/tensor.hpp) do the rest.

}  // namespace fp4attn::dispatch
