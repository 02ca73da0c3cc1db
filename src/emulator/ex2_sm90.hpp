// exp2 of the Direct-P-off ("exp2") paths as the sm90 kernels compute it:
// MUFU ex2.approx.ftz.f32, which differs from a correctly rounded exp2 by up
// to a few float steps (docs/numerics.md, "exp2 on sm90"). The P codes of
// those paths (E4M3 of 2^(u + 8); the MXFP4 block scale and E2M1 codes of
// 2^u; the NVFP4 block scale and E2M1 codes of 2^(u + 8)) only change where
// 2^x crosses a rounding boundary of the format, so
// the model stores the H200's result for every x whose result lies within
// kWindowUlps float steps of such a boundary (or flushes to zero), measured
// over every float x ≤ kScanMax by dev/ex2_approx; everywhere else host exp2f
// is on the same side of every boundary as the hardware, and is returned.
//
// The boundary rules are constexpr and host/device, so the scan on the GPU and
// the CPU tests use one definition.
#pragma once

#include <cstdint>
#include <span>

#include "fp4attn/formats.hpp"
#include "fp4attn/recipe.hpp"

namespace fp4attn::emulator::ex2 {

// Largest input scanned: FP8 P feeds x = u + 8 with u ≤ 1 (u = s·c − m), the
// MXFP4 path x = u.
inline constexpr float kScanMax = 9.0f;
// Width of the recorded window around each boundary, in float steps of the
// hardware result. The hardware is within 2 steps of exp2 and glibc's exp2f
// within 1 (dev/ex2_approx/README.md), so 8 leaves a wide margin.
inline constexpr std::uint32_t kWindowUlps = 8;
// The lookup runs when host exp2f is within this many steps of a boundary:
// the window plus the largest hardware-vs-host distance, with margin.
inline constexpr std::uint32_t kGuardUlps = 16;
inline constexpr std::uint32_t kMinNormalBits = 0x00800000u;  // 2^-126: ftz flushes below
inline constexpr std::uint32_t kInfBits = 0x7F800000u;
// Every boundary below lies on a 64th of a binade: a float whose low 17
// fraction bits are zero.
inline constexpr int kGridShift = 17;
inline constexpr int kGridSteps = 1 << (23 - kGridShift);  // grid points per binade

// Index on the grid (significand 1 + j / kGridSteps) of a positive integer n
// below 128 scaled to its binade, or −1 if n falls between grid points.
constexpr int grid_index_of(unsigned n) {
  int p = 0;
  while ((n >> (p + 1)) != 0) ++p;
  const unsigned scaled = n * kGridSteps;
  return scaled % (1u << p) == 0 ? static_cast<int>(scaled >> p) - kGridSteps : -1;
}

// NVFP4 P by the exp2 baseline (v = 2^(u + 8), tensor scale 1): the block
// scale UE4M3(fl(amax / 6)) changes where amax crosses 6 × a UE4M3 rounding
// midpoint, normal ((17 + 2i) / 16 · 2^e) or subnormal ((2i + 1) · 2^-10);
// an element's E2M1 code of fl(v / s_b) changes where v crosses an E2M1
// midpoint (significands 1, 1.25, 1.5, 1.75) times a UE4M3 value s_b
// (significands (8 + k) / 8, subnormals k · 2^-9 among them). All are small
// integers n scaled to a binade; the mask has bit j for significand 1 + j/64.
// They matter for v from 2^-11 (0.25 · 2^-9) up to 2^8 (u ≤ 0), where the
// binade range below keeps them; the test domain reaches 512.
constexpr std::uint64_t nvfp4_boundary_mask() {
  std::uint64_t mask = 0;
  auto add = [&mask](unsigned n) { mask |= std::uint64_t{1} << grid_index_of(n); };
  for (unsigned m = 4; m < 8; ++m)        // E2M1 midpoint significands · 4
    for (unsigned k = 8; k < 16; ++k) add(m * k);  // · UE4M3 significands · 8
  for (unsigned i = 0; i < 8; ++i) add(3 * (17 + 2 * i));  // 6 · normal midpoints · 8
  for (unsigned i = 0; i < 8; ++i) add(3 * (2 * i + 1));   // 6 · subnormal midpoints · 2^9
  return mask;
}
inline constexpr std::uint64_t kNvfp4Boundaries = nvfp4_boundary_mask();
inline constexpr int kNvfp4FirstBinade = -11, kNvfp4LastBinade = 8;

// Whether g, the bits of a positive normal float on the 1/64-binade grid, is a
// value at which a code decision of an exp2 path changes:
//  * MXFP4 P (x = u): E2M1 rounding midpoints 0.25, 0.75, 1.25, 1.75, 2.5,
//    3.5, 5 times the block scale 2^E; the round_up scale's threshold (block
//    maximum's significand > 1.5) and the OCP scale's (floor(log2 amax)): in
//    all, significands 1, 1.25, 1.5, 1.75 in every binade;
//  * FP8 P (x = u + 8): E4M3 midpoints, odd sixteenths in the normal binades
//    2^-6 .. 2^8 (those above 448 only matter without saturation, kept for
//    simplicity) and the subnormal ones (m + 1/2)·2^-9, of which those in
//    2^-7's binade are odd eighths and the rest already in the MX set;
//  * NVFP4 P (x = u + 8): kNvfp4Boundaries in binades 2^-11 .. 2^8.
FP4ATTN_HD constexpr bool is_decision_boundary(std::uint32_t g) {
  const int e = static_cast<int>(g >> 23) - 127;
  const std::uint32_t j64 = (g >> kGridShift) & (kGridSteps - 1u);
  if (e >= kNvfp4FirstBinade && e <= kNvfp4LastBinade && ((kNvfp4Boundaries >> j64) & 1u) != 0) return true;
  if ((j64 & 3u) != 0) return false;  // the FP8 and MX rules lie on sixteenths
  const std::uint32_t j = j64 >> 2;
  if ((j & 3u) == 0) return true;
  if (e >= -6 && e <= 8) return (j & 1u) != 0;
  if (e == -7) return (j & 3u) == 2u;
  return false;
}

// Whether the positive normal float with bits r lies within `window` float
// steps of a decision boundary.
FP4ATTN_HD constexpr bool near_decision_boundary(std::uint32_t r, std::uint32_t window) {
  if (r < kMinNormalBits || r >= kInfBits) return false;
  constexpr std::uint32_t kCell = 1u << kGridShift;
  const std::uint32_t low = r & (kCell - 1u), below = r - low;
  return (low <= window && is_decision_boundary(below)) || (kCell - low <= window && is_decision_boundary(below + kCell));
}

// Whether the scan records x, given the hardware result's bits: near a
// boundary, or flushed (ftz) where exp2f keeps a subnormal.
FP4ATTN_HD constexpr bool recorded(std::uint32_t result) {
  return result < kMinNormalBits || near_decision_boundary(result, kWindowUlps);
}

// Unsigned key in the order of the float values (−0 just below +0).
FP4ATTN_HD constexpr std::uint32_t order_key(std::uint32_t bits) {
  return (bits & 0x80000000u) != 0 ? ~bits : bits | 0x80000000u;
}

// A run of consecutive floats x_first .. x_last (bits; ascending values) on
// which the hardware returns `result` (bits).
struct Run {
  std::uint32_t x_first, x_last, result;
};

// The measured table (generated: src/emulator/ex2_sm90_table.cpp), sorted by
// x, runs disjoint.
std::span<const Run> sm90_table();

// ex2.approx.ftz.f32 of the H200 wherever a P code decision depends on it;
// host exp2f elsewhere.
float sm90(float x);

}  // namespace fp4attn::emulator::ex2

namespace fp4attn::emulator {

// The exp2 of the target's Direct-P-off P: the sm90 model, or exp2f for
// sm100 (Blackwell's unit is another one, not measured).
float ex2_for_target(Target t, float x);

// E4M3 code of P = 2^(u + 8) by the exp2 baseline on target t (the
// emulator's counterpart of the kernels' ex2.approx + cvt.rn.satfinite).
std::uint8_t fp8_code_exp2(Target t, float u);

}  // namespace fp4attn::emulator
