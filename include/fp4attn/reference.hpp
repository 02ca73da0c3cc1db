// fp64 attention forward and backward: the truth every executor is measured against.
#pragma once

#include <span>
#include <vector>

#include "fp4attn/recipe.hpp"
#include "fp4attn/tensor.hpp"

namespace fp4attn::reference {

struct ForwardResult {
  std::vector<double> o;    // (B, Sq, Hq, D); rows with no visible key are 0
  std::vector<double> lse;  // (B, Hq, Sq), natural log; -inf for fully masked rows
};

struct BackwardResult {
  std::vector<double> dq;  // (B, Sq, Hq, D)
  std::vector<double> dk;  // (B, Sk, Hkv, D), summed over each group of query heads
  std::vector<double> dv;  // (B, Sk, Hkv, D)
};

// Does query row i see key j?
bool visible(MaskKind mask, Window window, std::int64_t Sq, std::int64_t Sk, std::int64_t i, std::int64_t j);

// scale <= 0 means 1/sqrt(D).
ForwardResult forward(const AttentionShape& shape, std::span<const double> q, std::span<const double> k,
                      std::span<const double> v, MaskKind mask, double scale, Window window = {});

BackwardResult backward(const AttentionShape& shape, std::span<const double> q, std::span<const double> k,
                        std::span<const double> v, std::span<const double> d_o, MaskKind mask, double scale,
                        Window window = {});

}  // namespace fp4attn::reference
