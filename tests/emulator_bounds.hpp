// Calibrated error bounds of the emulator suites (see docs/accuracy.md for the
// measured figures and the command that regenerates this table).
#pragma once

#include <iterator>

#include "emulator_fixtures.hpp"
#include "fp4attn/error.hpp"

namespace fp4attn::emulator::testing {

// {recipe, target, direct_p, smooth_k, kernel {rel L2, rel L1, 1 − cos, max abs, LSE}, recipe {same}}
// clang-format off
inline constexpr Bounds kBounds[] = {
    {Recipe::fp8, Target::sm90, true, true, {3.55e-02, 3.62e-02, 3.15e-04, 8.41e-02, 4.28e-02}, {1.82e-01, 1.58e-01, 8.29e-03, 7.82e-01, 9.33e-01}},
    {Recipe::fp8, Target::sm90, true, false, {3.57e-02, 3.66e-02, 3.19e-04, 8.60e-02, 4.56e-02}, {2.20e-01, 1.96e-01, 1.19e-02, 9.29e-01, 1.00e+00}},
    {Recipe::fp8, Target::sm90, false, true, {3.52e-02, 3.60e-02, 3.09e-04, 8.07e-02, 4.66e-02}, {1.83e-01, 1.58e-01, 8.28e-03, 7.82e-01, 9.33e-01}},
    {Recipe::fp8, Target::sm90, false, false, {3.54e-02, 3.63e-02, 3.13e-04, 8.27e-02, 3.77e-02}, {2.20e-01, 1.96e-01, 1.18e-02, 9.33e-01, 9.99e-01}},
    {Recipe::mxfp4, Target::sm90, true, true, {3.54e-01, 3.44e-01, 2.16e-02, 1.85e+00, 7.29e-01}, {1.15e+00, 9.53e-01, 2.62e-01, 4.56e+00, 1.02e+01}},
    {Recipe::mxfp4, Target::sm90, true, false, {3.67e-01, 3.50e-01, 2.17e-02, 1.44e+00, 6.74e-01}, {1.22e+00, 1.05e+00, 3.23e-01, 4.07e+00, 4.93e+00}},
    {Recipe::mxfp4, Target::sm90, false, true, {3.54e-01, 3.44e-01, 2.16e-02, 1.85e+00, 7.29e-01}, {1.15e+00, 9.53e-01, 2.62e-01, 4.56e+00, 1.02e+01}},
    {Recipe::mxfp4, Target::sm90, false, false, {3.67e-01, 3.50e-01, 2.17e-02, 1.44e+00, 6.74e-01}, {1.22e+00, 1.05e+00, 3.23e-01, 4.07e+00, 4.93e+00}},
    {Recipe::mxfp4, Target::sm100, true, true, {3.54e-01, 3.44e-01, 2.16e-02, 1.85e+00, 7.29e-01}, {1.15e+00, 9.53e-01, 2.62e-01, 4.56e+00, 1.02e+01}},
    {Recipe::mxfp4, Target::sm100, true, false, {3.67e-01, 3.50e-01, 2.17e-02, 1.44e+00, 6.74e-01}, {1.22e+00, 1.05e+00, 3.23e-01, 4.07e+00, 4.93e+00}},
    {Recipe::mxfp4, Target::sm100, false, true, {3.54e-01, 3.44e-01, 2.16e-02, 1.85e+00, 7.29e-01}, {1.15e+00, 9.53e-01, 2.62e-01, 4.56e+00, 1.02e+01}},
    {Recipe::mxfp4, Target::sm100, false, false, {3.67e-01, 3.50e-01, 2.17e-02, 1.44e+00, 6.74e-01}, {1.22e+00, 1.05e+00, 3.23e-01, 4.07e+00, 4.93e+00}},
    {Recipe::nvfp4, Target::sm90, true, true, {1.93e-01, 1.94e-01, 7.22e-03, 1.15e+00, 2.99e-01}, {4.95e-01, 4.69e-01, 5.70e-02, 1.61e+00, 3.23e+00}},
    {Recipe::nvfp4, Target::sm90, true, false, {1.97e-01, 1.95e-01, 7.32e-03, 1.12e+00, 2.40e-01}, {6.76e-01, 6.24e-01, 9.91e-02, 2.43e+00, 3.72e+00}},
    {Recipe::nvfp4, Target::sm90, false, true, {1.93e-01, 1.94e-01, 7.22e-03, 1.15e+00, 2.99e-01}, {4.95e-01, 4.69e-01, 5.70e-02, 1.61e+00, 3.23e+00}},
    {Recipe::nvfp4, Target::sm90, false, false, {1.98e-01, 1.96e-01, 7.31e-03, 1.12e+00, 2.40e-01}, {6.77e-01, 6.23e-01, 9.93e-02, 2.43e+00, 3.71e+00}},
    {Recipe::mxfp4_train, Target::sm90, true, true, {3.64e-02, 3.68e-02, 3.32e-04, 1.06e-01, 4.77e-02}, {1.06e+00, 8.29e-01, 2.52e-01, 4.78e+00, 1.02e+01}},
    {Recipe::mxfp4_train, Target::sm90, true, false, {3.55e-02, 3.61e-02, 3.14e-04, 1.22e-01, 5.12e-02}, {1.12e+00, 9.25e-01, 3.05e-01, 3.84e+00, 4.88e+00}},
    {Recipe::mxfp4_train, Target::sm90, false, true, {3.56e-02, 3.61e-02, 3.16e-04, 1.06e-01, 4.31e-02}, {1.06e+00, 8.30e-01, 2.52e-01, 4.78e+00, 1.02e+01}},
    {Recipe::mxfp4_train, Target::sm90, false, false, {3.50e-02, 3.56e-02, 3.06e-04, 1.22e-01, 4.42e-02}, {1.12e+00, 9.27e-01, 3.06e-01, 3.84e+00, 4.86e+00}},
    {Recipe::mxfp4_train, Target::sm100, true, true, {3.64e-02, 3.68e-02, 3.31e-04, 1.06e-01, 4.77e-02}, {1.06e+00, 8.29e-01, 2.52e-01, 4.78e+00, 1.02e+01}},
    {Recipe::mxfp4_train, Target::sm100, true, false, {3.55e-02, 3.61e-02, 3.15e-04, 1.22e-01, 5.12e-02}, {1.12e+00, 9.25e-01, 3.05e-01, 3.84e+00, 4.87e+00}},
    {Recipe::mxfp4_train, Target::sm100, false, true, {3.56e-02, 3.61e-02, 3.16e-04, 1.06e-01, 4.31e-02}, {1.06e+00, 8.29e-01, 2.52e-01, 4.78e+00, 1.02e+01}},
    {Recipe::mxfp4_train, Target::sm100, false, false, {3.50e-02, 3.56e-02, 3.06e-04, 1.22e-01, 4.42e-02}, {1.12e+00, 9.26e-01, 3.06e-01, 3.84e+00, 4.86e+00}},
};
// clang-format on

// The bounds of a configuration; the target is ignored where it changes nothing.
inline const Bounds& bounds_for(const AttentionOptions& o) {
  const Target t = spec_of(o.recipe).qk == TensorFormat::mxfp4 ? o.target : Target::sm90;
  for (const Bounds& b : kBounds)
    if (b.recipe == o.recipe && b.target == t && b.direct_p == o.direct_p && b.smooth_k == o.smooth_k) return b;
  throw Error("options", "no calibrated bounds for " + describe(o));
}

}  // namespace fp4attn::emulator::testing
