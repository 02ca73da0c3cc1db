// Host quantizers (DESIGN §3.2). Every rule is written once here; the GPU
// quantizers are tested bit for bit against these functions.
#include "fp4attn/quantize.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "fp4attn/error.hpp"
#include "fp4attn/tensor.hpp"

namespace fp4attn {
namespace {

// 2688 = 6 · 448: the tensor amax maps to the largest E2M1 value times the
// largest UE4M3 block scale, so NVFP4 uses the whole two-level range.
constexpr float kNvfp4TensorScaleNumerator = kE2M1Max * kE4M3Max;
constexpr std::uint8_t kE8M0MaxFiniteCode = 254;
// Float significand with its leading one: 24 bits, the one at bit 23.
constexpr int kFloatMantissaBits = 23;
constexpr std::uint32_t kFloatImplicitOne = 1u << kFloatMantissaBits;
constexpr std::uint32_t kFloatMagnitudeMask = 0x7FFFFFFFu;  // every bit but the sign
// Significand of 1.5 in that form: the round-up MX exponent changes there,
// because 2^ceil(log2(amax/6)) = 2^(e-2) exactly when amax/2^e <= 6/4.
constexpr std::uint32_t kSignificandOnePointFive = kFloatImplicitOne | (kFloatImplicitOne >> 1);

ElemFormat element_format(TensorFormat f) { return f == TensorFormat::fp8_e4m3 ? ElemFormat::e4m3 : ElemFormat::e2m1; }

std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

// Normalized 24-bit significand of a finite nonzero float (subnormals shifted up).
std::uint32_t significand(float x) {
  const std::uint32_t a = float_bits(x) & kFloatMagnitudeMask;
  if ((a >> kFloatMantissaBits) != 0) return (a & (kFloatImplicitOne - 1u)) | kFloatImplicitOne;
  std::uint32_t m = a;
  while (m < kFloatImplicitOne) m <<= 1;
  return m;
}

// Number of consecutive elements of one (b, s, h) row that share a scale: the
// scale index of (b, s, h, d) is scale_index(b, s, h, 0) + d / row_group.
std::int64_t row_group(const QuantizedTensor& t) {
  if (t.axis == BlockAxis::along_s) return 1;
  return t.format == TensorFormat::fp8_e4m3 ? t.D : t.block;
}

std::int64_t scale_count(const QuantizedTensor& t) {
  if (t.format == TensorFormat::fp8_e4m3)
    return t.axis == BlockAxis::along_d ? t.B * t.H * ceil_div(t.S, t.block) : t.B * t.H * t.D;
  return t.axis == BlockAxis::along_d ? t.B * t.S * t.H * (t.D / t.block) : t.B * ceil_div(t.S, t.block) * t.H * t.D;
}

// Calls fn(first element of the run, run length, scale index) for every run of
// consecutive elements that share one scale, in memory order.
template <class Fn>
void for_each_scale_run(const QuantizedTensor& t, Fn&& fn) {
  const std::int64_t group = row_group(t);
  for (std::int64_t b = 0; b < t.B; ++b)
    for (std::int64_t s = 0; s < t.S; ++s)
      for (std::int64_t h = 0; h < t.H; ++h) {
        const std::int64_t row = ((b * t.S + s) * t.H + h) * t.D;
        const std::int64_t base = t.scale_index(b, s, h, 0);
        for (std::int64_t d = 0; d < t.D; d += group) fn(row + d, std::min(group, t.D - d), base + d / group);
      }
}

void require_dims(std::int64_t B, std::int64_t S, std::int64_t H, std::int64_t D, std::size_t size,
                  const std::string& name) {
  if (B <= 0 || S <= 0 || H <= 0 || D <= 0)
    throw Error(name, "sizes must be positive, got (B, S, H, D) = (" + std::to_string(B) + ", " + std::to_string(S) +
                          ", " + std::to_string(H) + ", " + std::to_string(D) + ")");
  if (static_cast<std::int64_t>(size) != B * S * H * D)
    throw Error(name,
                "holds " + std::to_string(size) + " elements, expected B*S*H*D = " + std::to_string(B * S * H * D));
}

// Reports the first non-finite element with its (b, s, h, d) index.
void require_finite_bshd(std::span<const float> x, std::int64_t S, std::int64_t H, std::int64_t D,
                         const std::string& name) {
  const auto bad = std::find_if(x.begin(), x.end(), [](float v) { return !std::isfinite(v); });
  if (bad == x.end()) return;
  std::int64_t i = bad - x.begin();
  const std::int64_t d = i % D;
  i /= D;
  const std::int64_t h = i % H;
  i /= H;
  const std::int64_t s = i % S;
  const std::int64_t b = i / S;
  throw Error(name, "non-finite value at [" + std::to_string(b) + ", " + std::to_string(s) + ", " + std::to_string(h) +
                        ", " + std::to_string(d) + "]");
}

float amax_of(std::span<const float> x) {
  float m = 0.0f;
  for (float v : x) m = std::max(m, std::fabs(v));
  return m;
}

}  // namespace

// ---- scale rules --------------------------------------------------------------

std::uint8_t mx_scale_code(float amax, MxScaleRule rule) {
  if (!std::isfinite(amax) || amax < 0.0f) throw Error("amax", "must be finite and non-negative");
  if (amax == 0.0f) return 0;
  // Integer arithmetic on amax = m·2^e: a float division amax/6 could round up
  // across a power of two and pick a scale twice too large.
  const int e = floor_log2(amax);
  int k = e - 2;
  if (rule == MxScaleRule::round_up && significand(amax) > kSignificandOnePointFive) k = e - 1;
  return static_cast<std::uint8_t>(std::clamp(k + kE8M0Bias, 0, static_cast<int>(kE8M0MaxFiniteCode)));
}

float nvfp4_tensor_scale(float tensor_amax) {
  if (!std::isfinite(tensor_amax) || tensor_amax < 0.0f) throw Error("tensor_amax", "must be finite and non-negative");
  if (tensor_amax == 0.0f) return 1.0f;
  // A tensor amax below 2688 / FLT_MAX would overflow S_enc to +inf and turn
  // 0 · S_enc into NaN; the largest finite scale keeps every product finite.
  return std::min(kNvfp4TensorScaleNumerator / tensor_amax, std::numeric_limits<float>::max());
}

std::uint8_t nvfp4_block_scale_code(float block_amax, float tensor_scale) {
  return encode_rne_sat(ElemFormat::ue4m3, (block_amax * tensor_scale) / kE2M1Max);
}

float fp8_block_scale(float amax) {
  if (!std::isfinite(amax) || amax < 0.0f) throw Error("amax", "must be finite and non-negative");
  // Zero (amax == 0, or an amax so small the quotient underflows) would make
  // x / scale undefined; such a block's codes are all zero under scale 1.
  const float scale = amax / kE4M3Max;
  return scale > 0.0f ? scale : 1.0f;
}

// ---- QuantizedTensor ----------------------------------------------------------

std::int64_t QuantizedTensor::scale_index(std::int64_t b, std::int64_t s, std::int64_t h, std::int64_t d) const {
  if (format == TensorFormat::fp8_e4m3) {
    if (axis == BlockAxis::along_d) return (b * H + h) * ceil_div(S, block) + s / block;
    return (b * H + h) * D + d;
  }
  if (axis == BlockAxis::along_d) return ((b * S + s) * H + h) * (D / block) + d / block;
  return ((b * ceil_div(S, block) + s / block) * H + h) * D + d;
}

float QuantizedTensor::value(std::int64_t b, std::int64_t s, std::int64_t h, std::int64_t d) const {
  const float q = decode(element_format(format), codes[bshd_index(S, H, D, b, s, h, d)]);
  const float v = q * scales[scale_index(b, s, h, d)];
  return format == TensorFormat::nvfp4 ? v / tensor_scale : v;
}

std::vector<float> QuantizedTensor::dequantize() const {
  std::vector<float> out(codes.size());
  const ElemFormat ef = element_format(format);
  const bool divide = format == TensorFormat::nvfp4;
  for_each_scale_run(*this, [&](std::int64_t first, std::int64_t count, std::int64_t si) {
    const float scale = scales[si];
    for (std::int64_t i = first; i < first + count; ++i) {
      const float v = decode(ef, codes[i]) * scale;
      out[i] = divide ? v / tensor_scale : v;
    }
  });
  return out;
}

// ---- quantize -----------------------------------------------------------------

QuantizedTensor quantize(std::span<const float> x, std::int64_t B, std::int64_t S, std::int64_t H, std::int64_t D,
                         TensorFormat format, BlockAxis axis, const QuantizeOptions& opt, const std::string& name) {
  require_dims(B, S, H, D, x.size(), name);
  QuantizedTensor t;
  t.format = format;
  t.axis = axis;
  t.B = B, t.S = S, t.H = H, t.D = D;
  switch (format) {
    case TensorFormat::fp8_e4m3:
      if (axis == BlockAxis::along_d && opt.fp8_token_block <= 0)
        throw Error("fp8_token_block", "must be positive, got " + std::to_string(opt.fp8_token_block));
      // along_s: one scale per channel over the whole sequence.
      t.block = axis == BlockAxis::along_d
                    ? opt.fp8_token_block
                    : static_cast<int>(std::min<std::int64_t>(S, std::numeric_limits<int>::max()));
      break;
    case TensorFormat::mxfp4: t.block = kMxfp4Block; break;
    case TensorFormat::nvfp4: t.block = kNvfp4Block; break;
  }
  if (format != TensorFormat::fp8_e4m3 && axis == BlockAxis::along_d && D % t.block != 0)
    throw Error(name, "head dim " + std::to_string(D) + " is not a multiple of the " + std::string(to_string(format)) +
                          " block of " + std::to_string(t.block));
  require_finite_bshd(x, S, H, D, name);

  std::vector<float> amax(static_cast<std::size_t>(scale_count(t)), 0.0f);
  for_each_scale_run(t, [&](std::int64_t first, std::int64_t count, std::int64_t si) {
    amax[si] = std::max(amax[si], amax_of(x.subspan(first, count)));
  });

  t.scales.resize(amax.size());
  if (format == TensorFormat::fp8_e4m3) {
    std::transform(amax.begin(), amax.end(), t.scales.begin(), fp8_block_scale);
  } else {
    t.scale_codes.resize(amax.size());
    if (format == TensorFormat::nvfp4) t.tensor_scale = nvfp4_tensor_scale(amax_of(x));
    for (std::size_t i = 0; i < amax.size(); ++i) {
      const bool mx = format == TensorFormat::mxfp4;
      t.scale_codes[i] =
          mx ? mx_scale_code(amax[i], opt.mx_scale_rule) : nvfp4_block_scale_code(amax[i], t.tensor_scale);
      t.scales[i] = mx ? decode_e8m0(t.scale_codes[i]) : decode(ElemFormat::ue4m3, t.scale_codes[i]);
    }
  }

  t.codes.resize(x.size());
  for_each_scale_run(t, [&](std::int64_t first, std::int64_t count, std::int64_t si) {
    const std::span<const float> in = x.subspan(first, count);
    std::uint8_t* out = t.codes.data() + first;
    switch (format) {
      case TensorFormat::fp8_e4m3: {
        const float scale = t.scales[si];
        for (std::int64_t i = 0; i < count; ++i) out[i] = encode_rne_sat(ElemFormat::e4m3, in[i] / scale);
        break;
      }
      case TensorFormat::mxfp4: {
        // Multiplying by 2^-k is exact, unlike a division by the decoded scale.
        const float inv = exp2i(kE8M0Bias - t.scale_codes[si]);
        for (std::int64_t i = 0; i < count; ++i) out[i] = encode_rne_sat(ElemFormat::e2m1, in[i] * inv);
        break;
      }
      case TensorFormat::nvfp4: {
        const float sb = t.scales[si];
        for (std::int64_t i = 0; i < count; ++i)
          out[i] = sb == 0.0f ? 0 : encode_rne_sat(ElemFormat::e2m1, (in[i] * t.tensor_scale) / sb);
        break;
      }
    }
  });
  return t;
}

// ---- smooth_k -----------------------------------------------------------------

std::vector<float> sequence_mean(std::span<const float> k, std::int64_t B, std::int64_t S, std::int64_t H,
                                 std::int64_t D) {
  require_dims(B, S, H, D, k.size(), "k");
  const std::int64_t channels = H * D;  // of one batch entry
  std::vector<double> total(static_cast<std::size_t>(B * channels), 0.0);
  std::vector<double> chunk(static_cast<std::size_t>(channels));
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t s0 = 0; s0 < S; s0 += kSequenceMeanChunk) {
      // s ascending in the outer loop keeps each chunk sum's order fixed and the reads contiguous.
      std::fill(chunk.begin(), chunk.end(), 0.0);
      for (std::int64_t s = s0; s < std::min(S, s0 + kSequenceMeanChunk); ++s)
        for (std::int64_t h = 0; h < H; ++h)
          for (std::int64_t d = 0; d < D; ++d) chunk[h * D + d] += k[bshd_index(S, H, D, b, s, h, d)];
      for (std::int64_t c = 0; c < channels; ++c) total[b * channels + c] += chunk[c];
    }
  std::vector<float> mean(total.size());
  for (std::size_t i = 0; i < total.size(); ++i) mean[i] = static_cast<float>(total[i] / static_cast<double>(S));
  return mean;
}

std::vector<float> subtract_sequence_mean(std::span<const float> k, std::span<const float> mean, std::int64_t B,
                                          std::int64_t S, std::int64_t H, std::int64_t D) {
  require_dims(B, S, H, D, k.size(), "k");
  if (static_cast<std::int64_t>(mean.size()) != B * H * D)
    throw Error("mean",
                "holds " + std::to_string(mean.size()) + " elements, expected B*H*D = " + std::to_string(B * H * D));
  std::vector<float> out(k.size());
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t s = 0; s < S; ++s)
      for (std::int64_t h = 0; h < H; ++h)
        for (std::int64_t d = 0; d < D; ++d) {
          const std::int64_t i = bshd_index(S, H, D, b, s, h, d);
          out[i] = k[i] - mean[(b * H + h) * D + d];
        }
  return out;
}

void require_finite(std::span<const float> x, const std::string& name) {
  const auto bad = std::find_if(x.begin(), x.end(), [](float v) { return !std::isfinite(v); });
  if (bad != x.end()) throw Error(name, "non-finite value at flat index " + std::to_string(bad - x.begin()));
}

// ---- FP4 packing --------------------------------------------------------------

std::vector<std::uint8_t> pack_fp4(std::span<const std::uint8_t> codes) {
  std::vector<std::uint8_t> packed((codes.size() + 1) / 2, 0);
  for (std::size_t i = 0; i + 1 < codes.size(); i += 2) packed[i / 2] = pack_fp4x2(codes[i], codes[i + 1]);
  // An odd count leaves the last byte's high nibble zero.
  if (codes.size() % 2 != 0) packed.back() = pack_fp4x2(codes.back(), 0);
  return packed;
}

std::vector<std::uint8_t> unpack_fp4(std::span<const std::uint8_t> packed, std::int64_t count) {
  if (count < 0 || (count + 1) / 2 > static_cast<std::int64_t>(packed.size()))
    throw Error("count", std::to_string(count) + " codes do not fit in " + std::to_string(packed.size()) + " bytes");
  std::vector<std::uint8_t> codes(static_cast<std::size_t>(count));
  for (std::int64_t i = 0; i < count; ++i) codes[i] = fp4_at(packed.data(), i);
  return codes;
}

}  // namespace fp4attn
