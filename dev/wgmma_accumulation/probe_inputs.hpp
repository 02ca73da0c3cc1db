// Deterministic inputs of the wgmma accumulation probe, shared by the device
// program (wgmma_probe.cu) and the host analysis (fit_model.cpp): a trial is
// one m64n128 output tile, D = C + Σ_steps A_t·B_tᵀ over 1 or 4 k32 steps, so
// each trial holds 64 × 128 independent dot products of 32 or 128 terms.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "fp4attn/formats.hpp"
#include "fp4attn/recipe.hpp"
#include "fp4attn/tensor.hpp"

namespace wgmma_probe {

inline constexpr int kM = 64, kN = 128, kK = 32, kMaxSteps = 4;
inline constexpr int kRowBytes = kK * kMaxSteps;  // A and B rows hold up to 4 k32 steps (128 B)
inline constexpr int kOutputs = kM * kN;

// splitmix64: the same stream on every machine and compiler.
struct Rng {
  std::uint64_t state;
  explicit Rng(std::uint64_t seed) : state(seed) {}
  std::uint64_t next() {
    std::uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  int below(int n) { return static_cast<int>(next() % static_cast<std::uint64_t>(n)); }
  int between(int lo, int hi) { return lo + below(hi - lo + 1); }
  double unit() { return static_cast<double>(next() >> 11) * 0x1p-53; }
  double normal() {  // Box-Muller
    const double u1 = unit() + 0x1p-60, u2 = unit();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }
};

// Operand families: what the exponents and signs of a trial's codes look like.
enum Family : int {
  kUniform,   // any finite code: exponents spread over the whole range
  kNarrow,    // exponents within 0..5 binades per row, random signs
  kGauss,     // N(0, 1)·2^s rounded to E4M3, like quantized activations
  kOneBig,    // small codes and one large code per row at a random position
  kZerosSub,  // uniform codes with many zeros (±0) and subnormals
  kPositive,  // A positive (like P), B Gaussian (like V)
  kCancel,    // the second half of each row cancels the first half's products
  kFamilies
};
// Initial accumulator of a trial.
enum CMode : int {
  kZeroInit,  // scale-d = 0 on the first step (C ignored)
  kPlusZero,  // scale-d = 1 with C = +0
  kRandomC,   // random fp32 C, 2^-16 .. 2^16 times the products' sum
  kCancelC,   // C ≈ −(the exact sum), so that the result cancels
  kCModes
};

struct SetSpec {
  const char* name;
  int trials;
  int steps;              // 1 or 4
  bool a_from_registers;  // wgmma RS (A in registers, as the kernel's P·V) instead of SS
  std::uint64_t seed;
};

struct Trial {
  int steps = 1;
  bool zero_init = true;
  int family = 0, c_mode = 0;
  std::vector<std::uint8_t> a = std::vector<std::uint8_t>(kM * kRowBytes);  // (64, 128) codes
  std::vector<std::uint8_t> b = std::vector<std::uint8_t>(kN * kRowBytes);  // (128, 128) codes
  std::vector<float> c = std::vector<float>(kOutputs);                      // (64, 128)
};

inline constexpr std::uint8_t kE4m3NanMag = 0x7F;
inline constexpr std::uint8_t kSign = 0x80;

inline float e4m3_value(std::uint8_t code) { return fp4attn::decode(fp4attn::ElemFormat::e4m3, code); }

inline std::uint8_t code_from_fields(int sign, int exp_field, int mantissa) {
  exp_field = exp_field < 0 ? 0 : exp_field > 15 ? 15 : exp_field;
  std::uint8_t mag = static_cast<std::uint8_t>((exp_field << 3) | mantissa);
  if (mag == kE4m3NanMag) mag = 0x7E;  // never NaN
  return static_cast<std::uint8_t>((sign ? kSign : 0) | mag);
}

inline std::uint8_t any_finite_code(Rng& r) {
  std::uint8_t c;
  do c = static_cast<std::uint8_t>(r.below(256));
  while ((c & 0x7F) == kE4m3NanMag);
  return c;
}

inline std::uint8_t gauss_code(Rng& r, int binade) {
  const float x = static_cast<float>(r.normal() * std::ldexp(1.0, binade));
  return fp4attn::encode_rne_sat(fp4attn::ElemFormat::e4m3, x);
}

// One row of `len` codes of the given family; `is_a` picks A's role where the
// family treats the operands differently.
inline void fill_row(Rng& r, int family, bool is_a, std::uint8_t* row, int len) {
  switch (family) {
    case kUniform:
      for (int k = 0; k < len; ++k) row[k] = any_finite_code(r);
      break;
    case kNarrow: {
      const int width = r.between(0, 5), e0 = r.between(1, 15 - width);
      for (int k = 0; k < len; ++k) row[k] = code_from_fields(r.below(2), e0 + r.between(0, width), r.below(8));
      break;
    }
    case kGauss: {
      const int binade = r.between(-4, 4);
      for (int k = 0; k < len; ++k) row[k] = gauss_code(r, binade);
      break;
    }
    case kOneBig: {
      for (int k = 0; k < len; ++k) row[k] = code_from_fields(r.below(2), r.between(1, 5), r.below(8));
      for (int s = 0; s < len / kK; ++s)
        row[s * kK + r.below(kK)] = code_from_fields(r.below(2), r.between(9, 15), r.below(8));
      break;
    }
    case kZerosSub:
      for (int k = 0; k < len; ++k) {
        const int pick = r.below(10);
        if (pick < 3)
          row[k] = static_cast<std::uint8_t>(r.below(2) ? kSign : 0);  // ±0
        else if (pick < 5)
          row[k] = code_from_fields(r.below(2), 0, r.between(1, 7));  // subnormal
        else
          row[k] = any_finite_code(r);
      }
      break;
    case kPositive:
      if (is_a) {
        for (int k = 0; k < len; ++k) row[k] = code_from_fields(0, r.between(0, 15), r.below(8));
      } else {
        for (int k = 0; k < len; ++k) row[k] = gauss_code(r, 0);
      }
      break;
    case kCancel: {
      const int e0 = r.between(3, 11);
      for (int s = 0; s < len / kK; ++s) {
        std::uint8_t* step = row + s * kK;
        for (int k = 0; k < kK / 2; ++k) step[k] = code_from_fields(r.below(2), e0 + r.between(-2, 2), r.below(8));
        // A negates, B copies: products pair up as x·y and −x·y, except where
        // a fresh code breaks the pair.
        for (int k = kK / 2; k < kK; ++k)
          step[k] = r.below(5) == 0 ? code_from_fields(r.below(2), e0 + r.between(-8, 0), r.below(8))
                                    : static_cast<std::uint8_t>(step[k - kK / 2] ^ (is_a ? kSign : 0));
      }
      break;
    }
    default:
      break;
  }
}

// Exact Σ a·b of output (i, j) over the trial's steps (every partial sum of
// E4M3 products is exact in double).
inline double exact_dot(const Trial& t, int i, int j) {
  double s = 0.0;
  for (int k = 0; k < t.steps * kK; ++k)
    s += static_cast<double>(e4m3_value(t.a[i * kRowBytes + k])) * e4m3_value(t.b[j * kRowBytes + k]);
  return s;
}

inline float random_c(Rng& r, double reference) {
  const int e = (reference != 0.0 ? std::ilogb(reference) : 0) + r.between(-16, 16);
  const float mant = 1.0f + static_cast<float>(r.next() >> 41) * 0x1p-23f;  // 23 random mantissa bits
  return (r.below(2) ? -1.0f : 1.0f) * std::ldexp(mant, e);
}

inline Trial make_trial(const SetSpec& set, int index) {
  Rng r(set.seed * 0x100000001B3ull + static_cast<std::uint64_t>(index));
  Trial t;
  t.steps = set.steps;
  t.family = r.below(kFamilies);
  t.c_mode = r.below(kCModes);
  t.zero_init = t.c_mode == kZeroInit;
  const int len = t.steps * kK;
  for (int i = 0; i < kM; ++i) fill_row(r, t.family, true, &t.a[i * kRowBytes], len);
  for (int j = 0; j < kN; ++j) fill_row(r, t.family, false, &t.b[j * kRowBytes], len);
  for (int i = 0; i < kM; ++i)
    for (int j = 0; j < kN; ++j) {
      float& c = t.c[i * kN + j];
      switch (t.c_mode) {
        case kRandomC:
          c = random_c(r, exact_dot(t, i, j));
          break;
        case kCancelC: {
          const double s = exact_dot(t, i, j);
          c = static_cast<float>(-s * (1.0 + (r.unit() - 0.5) * 0x1p-10));
          break;
        }
        default:
          c = 0.0f;
          break;
      }
    }
  return t;
}

// Sets measured in one device call. "fit_*" were used to find the model;
// "val_*" were only compared with the finished model.
inline const SetSpec kSets[] = {
    {"fit_single", 256, 1, false, 11}, {"fit_chain", 64, 4, false, 12}, {"val_single", 256, 1, false, 13},
    {"val_chain", 128, 4, false, 14},  {"val_rs", 128, 4, true, 15},
};

// Fixed forward problems: the GPU's O and LSE are written out and compared
// with the emulator offline (fit_model forward).
struct ForwardCase {
  fp4attn::AttentionShape shape;
  fp4attn::MaskKind mask;
  bool direct_p, smooth_k;
};
inline constexpr ForwardCase kForwardCases[] = {
    {{1, 2, 2, 256, 512, 128}, fp4attn::MaskKind::none, true, true},
    {{1, 4, 2, 200, 333, 64}, fp4attn::MaskKind::causal, true, true},
    {{1, 2, 1, 300, 1000, 128}, fp4attn::MaskKind::none, false, false},
};

}  // namespace wgmma_probe
