// Shared pieces of the emulator suites: inputs with the structure of real
// attention activations, and the two comparisons of DESIGN §7 (kernel error
// against the fp64 reference on the same quantized operands, recipe error
// against the fp64 reference on the original inputs).
#pragma once

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "fp4attn/emulator.hpp"
#include "fp4attn/metrics.hpp"
#include "fp4attn/recipe.hpp"
#include "fp4attn/reference.hpp"
#include "fp4attn/tensor.hpp"

namespace fp4attn::emulator::testing {

// A few channels of Q and K carry much larger values than the rest, and K has a
// per-channel offset shared by every token: the two features of real
// activations that break naive low-bit attention (the offset is what smooth_k
// removes).
inline constexpr int kOutlierChannels = 2;
inline constexpr float kOutlierGain = 3.0f;
inline constexpr float kKeyOffsetStd = 2.0f;

struct Inputs {
  std::vector<float> q, k, v;
};

inline Inputs realistic_inputs(const AttentionShape& s, std::uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<std::int64_t> channel(0, s.D - 1);
  std::vector<std::int64_t> outliers;
  for (int c = 0; c < kOutlierChannels; ++c) outliers.push_back(channel(gen));
  auto gain = [&](std::int64_t d) {
    for (std::int64_t o : outliers)
      if (o == d) return kOutlierGain;
    return 1.0f;
  };
  std::vector<float> key_offset(static_cast<std::size_t>(s.B * s.Hkv * s.D));
  for (float& x : key_offset) x = kKeyOffsetStd * normal(gen);
  Inputs in{std::vector<float>(s.q_elems()), std::vector<float>(s.kv_elems()), std::vector<float>(s.kv_elems())};
  for (std::int64_t i = 0; i < s.q_elems(); ++i) in.q[i] = normal(gen) * gain(i % s.D);
  for (std::int64_t i = 0; i < s.kv_elems(); ++i) {
    const std::int64_t d = i % s.D, h = (i / s.D) % s.Hkv, b = i / (s.D * s.Hkv * s.Sk);
    in.k[i] = normal(gen) * gain(d) + key_offset[(b * s.Hkv + h) * s.D + d];
    in.v[i] = normal(gen);
  }
  return in;
}

inline std::vector<double> to_double(const std::vector<float>& x) { return {x.begin(), x.end()}; }

// The operands the kernel multiplies, as real numbers: dequantized Q and V, and
// dequantized K with the smooth_k mean added back so the reference LSE is the
// true LSE of those operands (the shift changes no O).
inline reference::ForwardResult reference_on_quantized(const AttentionShape& s, const QuantizedInputs& in,
                                                       const AttentionOptions& opt) {
  std::vector<double> k = to_double(in.k.dequantize());
  if (!in.k_mean.empty())
    for (std::int64_t i = 0; i < s.kv_elems(); ++i) {
      const std::int64_t d = i % s.D, h = (i / s.D) % s.Hkv, b = i / (s.D * s.Hkv * s.Sk);
      k[i] += in.k_mean[(b * s.Hkv + h) * s.D + d];
    }
  return reference::forward(s, to_double(in.q.dequantize()), k, to_double(in.v.dequantize()), opt.mask,
                            opt.softmax_scale, opt.window);
}

inline reference::ForwardResult reference_on_inputs(const AttentionShape& s, const Inputs& x,
                                                    const AttentionOptions& opt) {
  return reference::forward(s, to_double(x.q), to_double(x.k), to_double(x.v), opt.mask, opt.softmax_scale,
                            opt.window);
}

struct Errors {
  ErrorMetrics kernel_o, recipe_o;  // O against the two references
  ErrorMetrics kernel_lse, recipe_lse;
};

inline Errors measure(const AttentionShape& s, const Inputs& x, const AttentionOptions& opt) {
  const QuantizedInputs in = quantize_inputs(s, x.q, x.k, x.v, opt);
  const ForwardResult got = forward(s, in, opt);
  const reference::ForwardResult kref = reference_on_quantized(s, in, opt);
  const reference::ForwardResult rref = reference_on_inputs(s, x, opt);
  return {compare(got.o, kref.o), compare(got.o, rref.o), compare(got.lse, kref.lse), compare(got.lse, rref.lse)};
}

inline std::string describe(const AttentionOptions& o) {
  return std::string(to_string(o.recipe)) + (o.direct_p ? " direct_p" : " exp2") +
         (o.smooth_k ? " smooth_k" : " raw_k") + " " + std::string(to_string(o.target)) +
         (o.mask == MaskKind::none ? " noncausal" : " causal");
}

}  // namespace fp4attn::emulator::testing

namespace fp4attn::emulator::testing {

// The problems every recipe is swept over: GQA (2 query heads per kv head),
// Sq != Sk, lengths that are no multiple of the tiles, head dims 64 and 128,
// and 32-wide tiles that make many tiles per row.
struct SweepProblem {
  AttentionShape shape;
  int block_q, block_k;
};
inline std::vector<SweepProblem> sweep_problems() {
  return {{{.B = 1, .Hq = 2, .Hkv = 1, .Sq = 191, .Sk = 319, .D = 64}, 64, 64},
          {{.B = 1, .Hq = 2, .Hkv = 1, .Sq = 133, .Sk = 97, .D = 128}, 32, 32}};
}

// Error bounds of one configuration, for O (rel L2, rel L1, 1 − cosine, max
// abs) and for LSE (max abs), against both references. Calibrated by
// EmulatorCalibration.DISABLED_PrintBounds (docs/accuracy.md): each bound is
// twice the worst value measured over its seeds, problems and masks.
struct OBounds {
  double rel_l2, rel_l1, one_minus_cos, max_abs, lse_max_abs;
};
struct Bounds {
  Recipe recipe;
  Target target;
  bool direct_p, smooth_k;
  OBounds kernel, recipe_error;
};

// Configurations the sweep covers: the target only matters where Q·Kᵀ (and
// for mxfp4 P·V) runs on FP4 operands.
inline std::vector<AttentionOptions> sweep_configs() {
  std::vector<AttentionOptions> out;
  for (Recipe r : kAllRecipes)
    for (Target t : {Target::sm90, Target::sm100}) {
      if (t == Target::sm100 && spec_of(r).qk != TensorFormat::mxfp4) continue;
      for (bool direct : {true, false})
        for (bool smooth : {true, false}) {
          AttentionOptions o;
          o.recipe = r, o.target = t, o.direct_p = direct, o.smooth_k = smooth;
          out.push_back(o);
        }
    }
  return out;
}

}  // namespace fp4attn::emulator::testing
