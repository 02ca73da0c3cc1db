// Synthetic attention inputs. Plain gaussians flatter low-bit formats; real
// Q and K carry a few outlier channels (which stretch the block scales) and K
// carries a mean offset shared by all tokens (which smooth_k removes). Both are
// built in here so the accuracy table reflects what the formats meet in models.
#include "synthetic.hpp"

#include <cmath>
#include <numbers>
#include <random>

namespace fp4attn::cli {
namespace {

// Channels of Q and K scaled up, and by how much: with unit gaussians elsewhere
// this puts the score standard deviation near 3 at D = 128, peaked but not
// one-hot attention.
constexpr std::int64_t kOutlierChannels = 4;
constexpr float kOutlierGain = 4.0f;
// Standard deviation of K's per-channel mean offset across channels.
constexpr float kKeyMeanSpread = 2.0f;
// Stream offsets so Q, K, V and the K mean draw from independent sequences.
enum class Stream : std::uint64_t { q = 1, k = 2, v = 3, k_mean = 4 };
// 2^64 / golden ratio: spreads nearby seeds far apart in the generator's seed space.
constexpr std::uint64_t kSeedMix = 0x9E3779B97F4A7C15ull;

// Box-Muller on mt19937_64 bits: std::normal_distribution differs between
// standard libraries, and the default problem must be the same everywhere.
class Gaussian {
 public:
  Gaussian(std::uint64_t seed, Stream stream) : rng_(seed * kSeedMix + static_cast<std::uint64_t>(stream)) {}
  float operator()() {
    // The top 53 bits of a draw fill a double's mantissa exactly.
    constexpr int kMantissaBits = 53;
    constexpr int kDropBits = 64 - kMantissaBits;
    constexpr double kUnit = 1.0 / static_cast<double>(1ull << kMantissaBits);
    const double u1 = (static_cast<double>(rng_() >> kDropBits) + 1.0) * kUnit;  // (0, 1]: log(u1) is finite
    const double u2 = static_cast<double>(rng_() >> kDropBits) * kUnit;          // [0, 1)
    return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2));
  }

 private:
  std::mt19937_64 rng_;
};

std::vector<float> gaussian(std::int64_t count, std::uint64_t seed, Stream stream) {
  Gaussian g(seed, stream);
  std::vector<float> x(static_cast<std::size_t>(count));
  for (float& e : x) e = g();
  return x;
}

// Scales the first kOutlierChannels channels of every head of a (B, S, H, D) tensor.
void add_outlier_channels(std::vector<float>& x, std::int64_t D) {
  for (std::size_t i = 0; i < x.size(); ++i)
    if (static_cast<std::int64_t>(i) % D < kOutlierChannels) x[i] *= kOutlierGain;
}

}  // namespace

Problem make_synthetic(const AttentionShape& shape, MaskKind mask, std::uint64_t seed) {
  Problem p{shape, gaussian(shape.q_elems(), seed, Stream::q), gaussian(shape.kv_elems(), seed, Stream::k),
            gaussian(shape.kv_elems(), seed, Stream::v), mask, Window{}};
  add_outlier_channels(p.q, shape.D);
  add_outlier_channels(p.k, shape.D);
  // One offset per (head, channel), the same for every token and batch.
  std::vector<float> mean = gaussian(shape.Hkv * shape.D, seed, Stream::k_mean);
  for (std::size_t i = 0; i < p.k.size(); ++i) p.k[i] += kKeyMeanSpread * mean[i % mean.size()];
  return p;
}

}  // namespace fp4attn::cli
