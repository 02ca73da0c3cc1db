// How many consumer warpgroups a CTA of the FP8 forward kernel runs: at
// D = 64 three (192 query rows) or two (128); one (64, two CTAs an SM) where
// a CTA's keys are few. Plain C++, so that the rule is
// tested without a GPU (tests/test_consumer_count.cpp).
#pragma once

#include <cstdint>

namespace fp4attn::sm90::fwd {

// A CTA of three consumers runs its 192 rows in ≈ 1.5 / kThreeConsumerGain
// of a two-consumer CTA's time: the gain ncu measured at S = 16k (11.97 →
// 11.31 M cycles, docs/perf-log.md v13; later steps added a few per cent that
// the rule leaves out). Whole waves of CTAs over the SMs decide the rest, so
// short or few sequences keep 128-row CTAs (less padding past Sq, more CTAs
// to fill the SMs).
inline constexpr double kThreeConsumerGain = 1.05;
// Causal grids take three only from this Sq on: a 192-row CTA's diagonal
// tiles mask more of their keys, and below 8k that cost outweighs the gain
// (v13c: −1 % at S = 2k and 4k, +4 % at 8k, +7 % at 16k).
inline constexpr std::int64_t kCausalThreeConsumerMinSq = 8192;

inline bool three_consumers_pay_off(std::int64_t B, std::int64_t Hq, std::int64_t Sq, bool causal, std::int64_t sms) {
  if (causal && Sq < kCausalThreeConsumerMinSq) return false;
  const std::int64_t heads = B * Hq;
  const auto waves = [&](std::int64_t rows) { return (heads * ((Sq + rows - 1) / rows) + sms - 1) / sms; };
  return static_cast<double>(waves(192)) * 1.5 / kThreeConsumerGain < static_cast<double>(waves(128));
}

// One consumer a CTA, two CTAs an SM, at D = 64 where a CTA's keys are few:
// its start and end (≈ 7 400 cycles, against ≈ 1 700 a key tile) then weigh
// most, and the other CTA's tiles run beside them. Up to 1024 keys one
// consumer measured +7 to +10 % over two in bursts (packed short sequences
// too) and +6 / +9 % under sustained load at S = 1k (noncausal / causal);
// causal up to 2048 keys +6 % in bursts and +3 % sustained, at 4096 +5 % in
// bursts and −1 % sustained, where two consumers reach the card's power
// limit too. At D = 128 with Direct-P it gained ≤ 3 % in bursts and lost up
// to 4 % under sustained load (the power limit: twice the K and V from L2
// for the same work), so Direct-P keeps two there. Sk is the longest
// sequence's for packed sequences (max_seqlen_k under graph capture): a batch
// whose longest sequence is past the bound keeps two or three consumers for
// all of them (perf log sc1, sc2, sc3).
inline constexpr std::int64_t kOneConsumerMaxKeys = 1024;
inline constexpr std::int64_t kOneConsumerMaxCausalKeys = 2048;

// With exp2 P (Direct-P off, the comparison path) one consumer wherever three
// do not pay off: the exp2 softmax and its rounding converts outlast the
// partner's products, so two consumers' turns leave the tensor core waiting
// (their kernel held 1935–1980 MHz under sustained load, below the power
// limit) and a second CTA's tiles fill it. Under sustained load one measured
// +4 to +6 % over two at D = 128, S = 1k–16k, and +17 / +18 % at D = 64,
// causal S = 2k / 4k; three stay ahead where the launcher takes them (one:
// −13 to −15 % at D = 64, noncausal S = 2k–16k) (perf log sc3). Recipe
// mxfp4's FP4 P by exp2 (its MX block scale and E2M1 rounding by integer
// steps, a longer softmax still) likewise: +4 to +5 % at D = 128, S = 4k and
// 16k, in bursts and under sustained load (perf log mx11); the launcher takes
// its one-consumer kernel at D = 128 only.
// The caller takes three first where three_consumers_pay_off.
inline bool one_consumer_pays_off(std::int64_t Sk, std::int64_t D, bool causal, bool exp2_p) {
  if (D == 128) return exp2_p;
  return D == 64 && (exp2_p || Sk <= kOneConsumerMaxKeys || (causal && Sk <= kOneConsumerMaxCausalKeys));
}

}  // namespace fp4attn::sm90::fwd
