// GPU quantizer for the FP4 recipes against the CPU quantizer
// (fp4attn::quantize, sequence_mean), bit for bit: the packed E2M1 codes,
// the E8M0 / UE4M3 scale codes and NVFP4's tensor scale, for q and k (blocks
// along D) and v (blocks along the sequence, transposed or not, padded), over
// bf16, fp16 and fp32 inputs, dense and strided layouts (a (B, S, H, D) view
// of a (B, S, 3H, D) buffer; odd pads that defeat vector loads), sequence
// lengths that are not a multiple of the block, both MX scale rules and
// smooth_k. Inputs are normal values times a heavy-tailed factor, with
// planted blocks whose quotients sit exactly on E2M1 rounding ties or past
// the saturation point. Then the chunked order of the mean, non-finite input
// reported by tensor name, and arguments the quantizer must refuse.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cuda/quantize/e2m1_pairs.cuh"
#include "cuda/quantize/quantize_fp4.hpp"
#include "fp4attn/error.hpp"
#include "fp4attn/quantize.hpp"
#include "fp4attn/tensor.hpp"
#include "gpu/gpu_test_util.hpp"

namespace fp4attn {
namespace {

namespace cq = cuda_quantize;
using cq::Fp4Operand;
using gpu_test::DeviceArray;

constexpr float kF16Limit = 30000.0f;  // keeps fp16 inputs finite after the heavy tail
constexpr float kOutlierRate = 0.002f;
constexpr float kOutlierFactor = 256.0f;
constexpr int kPlantOneBlockIn = 4;     // planted blocks: one in this many
constexpr float kNvTensorAmaxUnit = kE2M1Max * kE4M3Max;  // 2688: S_enc = 1 / unit exactly
// E2M1 rounding ties, exact codes, and values past the largest code, in units of the block scale.
constexpr float kTieValues[] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f, 0.5f, 3.0f, 0.125f, 6.0f, 0.0f};

template <class T>
struct Elem;
template <>
struct Elem<__nv_bfloat16> {
  static constexpr cq::ElementType type = cq::ElementType::bf16;
  static constexpr const char* name = "bf16";
  static __nv_bfloat16 from(float x) { return __float2bfloat16_rn(x); }
  static float to(__nv_bfloat16 x) { return __bfloat162float(x); }
};
template <>
struct Elem<__half> {
  static constexpr cq::ElementType type = cq::ElementType::f16;
  static constexpr const char* name = "fp16";
  static __half from(float x) { return __float2half_rn(x); }
  static float to(__half x) { return __half2float(x); }
};
template <>
struct Elem<float> {
  static constexpr cq::ElementType type = cq::ElementType::f32;
  static constexpr const char* name = "fp32";
  static float from(float x) { return x; }
  static float to(float x) { return x; }
};

// Element padding of a device layout (B, S, H, D): head, token and batch
// strides grow by these many elements and the data starts `offset` elements in.
struct Layout {
  std::int64_t head_pad = 0, token_pad = 0, batch_pad = 0, offset = 0;
};
enum class LayoutKind { dense, qkv_slot, odd_pad };

Layout layout_of(LayoutKind kind, std::int64_t H, std::int64_t D) {
  switch (kind) {
    case LayoutKind::dense: return {};
    case LayoutKind::qkv_slot: return {0, 2 * H * D, 0, H * D};  // the middle third of (B, S, 3H, D)
    case LayoutKind::odd_pad: return {3, 5, 7, 1};                // misaligned: element-wise loads
  }
  return {};
}

// A logical (B, S, H, D) tensor on the device; the padding holds NaN, so a
// read outside the tensor would be reported as non-finite input.
struct DeviceTensor {
  DeviceArray<unsigned char> bytes;
  cq::StridedInput view;

  template <class T>
  DeviceTensor(const std::vector<float>& x, std::int64_t B, std::int64_t S, std::int64_t H, std::int64_t D,
               const Layout& l, T)
      : bytes(static_cast<std::size_t>(l.offset + B * (S * (H * (D + l.head_pad) + l.token_pad) + l.batch_pad)) *
              sizeof(T)) {
    const std::int64_t sh = D + l.head_pad, ss = H * sh + l.token_pad, sb = S * ss + l.batch_pad;
    std::vector<T> host(bytes.count / sizeof(T), Elem<T>::from(std::nanf("")));
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t s = 0; s < S; ++s)
        for (std::int64_t h = 0; h < H; ++h)
          for (std::int64_t d = 0; d < D; ++d)
            host[l.offset + b * sb + s * ss + h * sh + d] = Elem<T>::from(x[bshd_index(S, H, D, b, s, h, d)]);
    cudaMemcpy(bytes.ptr, host.data(), bytes.bytes(), cudaMemcpyHostToDevice);
    view = {bytes.ptr + l.offset * sizeof(T), Elem<T>::type, B, S, H, D, sb, ss, sh};
  }
};

struct Case {
  Fp4Operand op = Fp4Operand::q;
  TensorFormat format = TensorFormat::mxfp4;
  MxScaleRule rule = MxScaleRule::round_up;
  bool smooth_k = false;
  bool v_transposed = true;
  std::int64_t B = 1, S = 1, H = 1, D = 64;
  LayoutKind layout = LayoutKind::dense;
  bool plant = false;  // planted ties and saturation
};

const char* op_name(Fp4Operand op) { return op == Fp4Operand::q ? "q" : op == Fp4Operand::k ? "k" : "v"; }

std::string describe(const Case& c, const char* type, std::uint32_t seed) {
  return std::string(op_name(c.op)) + " " + std::string(to_string(c.format)) + " " + type +
         (c.rule == MxScaleRule::round_up ? " round_up" : " ocp_floor") + " B=" + std::to_string(c.B) +
         " S=" + std::to_string(c.S) + " H=" + std::to_string(c.H) + " D=" + std::to_string(c.D) +
         " smooth_k=" + std::to_string(c.smooth_k) + " transposed=" + std::to_string(c.v_transposed) +
         " layout=" + std::to_string(static_cast<int>(c.layout)) + " planted=" + std::to_string(c.plant) +
         " seed=" + std::to_string(seed);
}

BlockAxis axis_of(Fp4Operand op) { return op == Fp4Operand::v ? BlockAxis::along_s : BlockAxis::along_d; }

// Calls fn(flat indices of the block's elements) for every scale block.
template <class Fn>
void for_each_block(const Case& c, int block, Fn&& fn) {
  std::vector<std::int64_t> idx;
  if (axis_of(c.op) == BlockAxis::along_d) {
    for (std::int64_t b = 0; b < c.B; ++b)
      for (std::int64_t s = 0; s < c.S; ++s)
        for (std::int64_t h = 0; h < c.H; ++h)
          for (std::int64_t d0 = 0; d0 < c.D; d0 += block) {
            idx.clear();
            for (std::int64_t d = d0; d < d0 + block; ++d) idx.push_back(bshd_index(c.S, c.H, c.D, b, s, h, d));
            fn(idx);
          }
  } else {
    for (std::int64_t b = 0; b < c.B; ++b)
      for (std::int64_t s0 = 0; s0 < c.S; s0 += block)
        for (std::int64_t h = 0; h < c.H; ++h)
          for (std::int64_t d = 0; d < c.D; ++d) {
            idx.clear();
            for (std::int64_t s = s0; s < std::min(c.S, s0 + block); ++s)
              idx.push_back(bshd_index(c.S, c.H, c.D, b, s, h, d));
            fn(idx);
          }
  }
}

// Normal values times a log-normal factor, a few outliers, some exact zeros;
// with c.plant, one block in kPlantOneBlockIn holds exact E2M1 ties and
// values past the largest code, in units of the block scale it will get.
template <class T>
std::vector<float> make_input(const Case& c, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> unit(0.0f, 1.0f);
  const float limit = sizeof(T) == 2 && Elem<T>::type == cq::ElementType::f16 ? kF16Limit : 1e30f;
  std::vector<float> x(static_cast<std::size_t>(c.B * c.S * c.H * c.D));
  std::vector<float> channel_offset(static_cast<std::size_t>(c.D));
  for (float& o : channel_offset) o = c.op == Fp4Operand::k ? 3.0f * normal(rng) : 0.0f;  // what smooth_k removes
  for (std::size_t i = 0; i < x.size(); ++i) {
    float v = normal(rng) * std::exp(1.5f * normal(rng));
    if (unit(rng) < kOutlierRate) v *= kOutlierFactor;
    if (unit(rng) < 0.01f) v = 0.0f;
    x[i] = std::clamp(v + channel_offset[i % c.D], -limit, limit);
  }
  if (c.plant) {
    const int block = cq::fp4_block(c.format);
    std::uniform_int_distribution<int> pick_tie(0, static_cast<int>(std::size(kTieValues)) - 1);
    std::uniform_int_distribution<int> pick_exp(-8, 8);
    std::uniform_int_distribution<int> pick_one(0, kPlantOneBlockIn - 1);
    float nv_unit = 1.0f;
    if (c.format == TensorFormat::nvfp4) {
      float m = 0.0f;
      for (float v : x) m = std::max(m, std::fabs(v));
      nv_unit = std::exp2(std::ceil(std::log2(m / kNvTensorAmaxUnit)));
    }
    const float nv_scales[] = {1.0f, 1.5f, 0.75f, 1.25f};  // UE4M3 values: the block scale comes out exactly
    for_each_block(c, block, [&](const std::vector<std::int64_t>& idx) {
      if (pick_one(rng) != 0) return;
      float scale, top;
      if (c.format == TensorFormat::mxfp4) {
        scale = std::exp2(static_cast<float>(pick_exp(rng)));
        // 6·2^j: scale 2^j under both rules; 7·2^j: 2^(j+1) (round_up, 3.5 a tie) or 2^j (ocp_floor, saturates).
        top = (pick_one(rng) == 0 ? 7.0f : 6.0f) * scale;
      } else {
        scale = nv_scales[pick_one(rng)] * nv_unit;
        top = kE2M1Max * scale;  // block scale code = the UE4M3 value of nv_scales[...]
      }
      for (std::size_t i = 0; i < idx.size(); ++i) {
        const float sign = unit(rng) < 0.5f ? -1.0f : 1.0f;
        x[idx[i]] = i == 0 ? sign * top : sign * kTieValues[pick_tie(rng)] * scale;
      }
    });
    if (c.format == TensorFormat::nvfp4) x[0] = kNvTensorAmaxUnit * nv_unit;  // S_enc = 1 / nv_unit exactly
  }
  for (float& v : x) v = Elem<T>::to(Elem<T>::from(v));
  return x;
}

struct DeviceOutputs {
  cq::Fp4Sizes sizes;
  DeviceArray<std::uint8_t> codes, scales;
  DeviceArray<float> tensor_scale, k_mean;
  DeviceArray<int> flags;
  DeviceArray<unsigned char> workspace;
  cq::Fp4Buffers bufs;

  explicit DeviceOutputs(const Case& c)
      : sizes(cq::fp4_sizes(c.op, c.format, c.B, c.S, c.H, c.D)),
        codes(static_cast<std::size_t>(sizes.code_bytes)),
        scales(static_cast<std::size_t>(sizes.scale_bytes)),
        tensor_scale(1),
        k_mean(static_cast<std::size_t>(c.B * c.H * c.D)),
        flags(3),
        workspace(cq::fp4_workspace_bytes(c.B, c.S, c.H, c.D)) {
    cudaMemset(workspace.ptr, 0xFF, workspace.bytes());
    cudaMemset(flags.ptr, 0, flags.bytes());
    cq::Fp4Output o{codes.ptr, scales.ptr, tensor_scale.ptr};
    (c.op == Fp4Operand::q ? bufs.q : c.op == Fp4Operand::k ? bufs.k : bufs.v) = o;
    bufs.k_mean = k_mean.ptr;
    bufs.nonfinite = flags.ptr;
    bufs.workspace = workspace.ptr;
  }
  // 0xFF everywhere: code 15 (−6), scale code NaN; unwritten output shows.
  void poison() {
    codes.poison(), scales.poison(), tensor_scale.poison(), k_mean.poison();
  }
};

cq::Fp4Options options_of(const Case& c) {
  cq::Fp4Options o;
  o.format = c.format;
  o.mx_scale_rule = c.rule;
  o.smooth_k = c.smooth_k;
  o.v_transposed = c.v_transposed;
  return o;
}

std::uint8_t nibble(const std::vector<std::uint8_t>& packed, std::int64_t i) { return fp4_at(packed.data(), i); }

// Bitwise comparison of one operand's device outputs with the CPU quantizer.
void expect_matches_cpu(const Case& c, const std::vector<float>& x, DeviceOutputs& dev, const std::string& where) {
  QuantizeOptions qo;
  qo.mx_scale_rule = c.rule;
  std::vector<float> mean;
  const std::string name = op_name(c.op);
  const QuantizedTensor cpu = [&] {
    if (c.op == Fp4Operand::k && c.smooth_k) {
      mean = sequence_mean(x, c.B, c.S, c.H, c.D);
      return quantize(subtract_sequence_mean(x, mean, c.B, c.S, c.H, c.D), c.B, c.S, c.H, c.D, c.format,
                      BlockAxis::along_d, qo, name);
    }
    return quantize(x, c.B, c.S, c.H, c.D, c.format, axis_of(c.op), qo, name);
  }();
  const std::vector<std::uint8_t> codes = dev.codes.download(), scales = dev.scales.download();
  const int block = cpu.block;
  const std::int64_t padded = cq::fp4_padded_tokens(c.S);
  std::size_t bad_codes = 0, bad_scales = 0, bad_padding = 0;
  std::string first;
  auto code_mismatch = [&](std::int64_t b, std::int64_t s, std::int64_t h, std::int64_t d, int got) {
    const int want = cpu.codes[bshd_index(c.S, c.H, c.D, b, s, h, d)];
    if (got == want) return;
    if (bad_codes++ == 0)
      first = "code at [" + std::to_string(b) + ", " + std::to_string(s) + ", " + std::to_string(h) + ", " +
              std::to_string(d) + "] got " + std::to_string(got) + " want " + std::to_string(want) + " (x = " +
              std::to_string(x[bshd_index(c.S, c.H, c.D, b, s, h, d)]) + ")";
  };
  for (std::int64_t b = 0; b < c.B; ++b)
    for (std::int64_t h = 0; h < c.H; ++h) {
      const std::int64_t slice = b * c.H + h;
      if (c.op != Fp4Operand::v) {
        for (std::int64_t s = 0; s < c.S; ++s) {
          for (std::int64_t d = 0; d < c.D; ++d) code_mismatch(b, s, h, d, nibble(codes, (slice * c.S + s) * c.D + d));
          for (std::int64_t j = 0; j < c.D / block; ++j)
            bad_scales += scales[(slice * c.S + s) * (c.D / block) + j] !=
                          cpu.scale_codes[((b * c.S + s) * c.H + h) * (c.D / block) + j];
        }
        continue;
      }
      for (std::int64_t s = 0; s < padded; ++s)
        for (std::int64_t d = 0; d < c.D; ++d) {
          const std::int64_t at = c.v_transposed ? (slice * c.D + d) * padded + s : (slice * padded + s) * c.D + d;
          if (s < c.S) code_mismatch(b, s, h, d, nibble(codes, at));
          else bad_padding += nibble(codes, at) != 0;
        }
      const std::int64_t cpu_blocks = (c.S + block - 1) / block;
      for (std::int64_t j = 0; j < padded / block; ++j)
        for (std::int64_t d = 0; d < c.D; ++d) {
          const std::uint8_t got = scales[((slice * (padded / block)) + j) * c.D + d];
          if (j < cpu_blocks) bad_scales += got != cpu.scale_codes[((b * cpu_blocks + j) * c.H + h) * c.D + d];
          else bad_padding += got != 0;
        }
    }
  EXPECT_EQ(bad_codes, 0u) << bad_codes << " codes differ, first " << first << " — " << where;
  EXPECT_EQ(bad_scales, 0u) << "scale codes differ — " << where;
  EXPECT_EQ(bad_padding, 0u) << "padding must hold zero codes and scales — " << where;
  if (c.format == TensorFormat::nvfp4) {
    const float got = dev.tensor_scale.download()[0];
    EXPECT_EQ(std::memcmp(&got, &cpu.tensor_scale, sizeof(float)), 0)
        << "tensor scale got " << got << " want " << cpu.tensor_scale << " — " << where;
  }
  if (!mean.empty()) {
    const std::vector<float> got = dev.k_mean.download();
    std::size_t bad = 0;
    for (std::size_t i = 0; i < mean.size(); ++i) bad += std::memcmp(&got[i], &mean[i], sizeof(float)) != 0;
    EXPECT_EQ(bad, 0u) << "k_mean differs from sequence_mean — " << where;
  }
}

// as_graph: the quantizer's kernels captured into a CUDA graph and run from it.
template <class T>
void check_case(const Case& c, bool as_graph = false) {
  const std::uint32_t seed = gpu_test::fresh_seed();
  std::mt19937 rng(seed);
  const std::vector<float> x = make_input<T>(c, rng);
  const DeviceTensor in(x, c.B, c.S, c.H, c.D, layout_of(c.layout, c.H, c.D), T{});
  DeviceOutputs dev(c);
  dev.poison();
  const std::string where = describe(c, Elem<T>::name, seed) + (as_graph ? " (graph)" : "");
  if (as_graph)
    gpu_test::run_as_graph([&](cudaStream_t stream) { cq::quantize_fp4(in.view, c.op, options_of(c), dev.bufs, stream); });
  else
    cq::quantize_fp4(in.view, c.op, options_of(c), dev.bufs, nullptr);
  cq::check_finite(dev.bufs, nullptr);
  expect_matches_cpu(c, x, dev, where);
}

void check_all_types(const Case& c) {
  check_case<__nv_bfloat16>(c);
  check_case<__half>(c);
  check_case<float>(c);
}

constexpr TensorFormat kFormats[] = {TensorFormat::mxfp4, TensorFormat::nvfp4};
constexpr MxScaleRule kRules[] = {MxScaleRule::round_up, MxScaleRule::ocp_floor};

TEST(GpuQuantizeFp4, QAndKMatchCpuBitForBit) {
  FP4ATTN_REQUIRE_HOPPER();
  for (TensorFormat f : kFormats)
    for (MxScaleRule rule : kRules) {
      if (f == TensorFormat::nvfp4 && rule == MxScaleRule::ocp_floor) continue;  // NVFP4 has no MX rule
      check_all_types({Fp4Operand::q, f, rule, false, true, 2, 300, 3, 128, LayoutKind::qkv_slot});
      check_all_types({Fp4Operand::q, f, rule, false, true, 1, 77, 2, 64, LayoutKind::odd_pad});
      check_all_types({Fp4Operand::k, f, rule, false, true, 2, 129, 2, 32, LayoutKind::dense});
      check_all_types({Fp4Operand::k, f, rule, true, true, 2, 300, 3, 128, LayoutKind::qkv_slot});
      check_all_types({Fp4Operand::k, f, rule, true, true, 1, 1000, 1, 64, LayoutKind::odd_pad});
      check_all_types({Fp4Operand::k, f, rule, true, true, 3, 5, 2, 256, LayoutKind::dense});
    }
  check_all_types({Fp4Operand::q, TensorFormat::nvfp4, MxScaleRule::round_up, false, true, 1, 40, 2, 16,
                   LayoutKind::odd_pad});
}

TEST(GpuQuantizeFp4, VMatchesCpuBitForBit) {
  FP4ATTN_REQUIRE_HOPPER();
  for (TensorFormat f : kFormats)
    for (MxScaleRule rule : kRules) {
      if (f == TensorFormat::nvfp4 && rule == MxScaleRule::ocp_floor) continue;
      for (bool transposed : {true, false}) {
        check_all_types({Fp4Operand::v, f, rule, false, transposed, 2, 300, 3, 128, LayoutKind::qkv_slot});
        check_all_types({Fp4Operand::v, f, rule, false, transposed, 1, 1000, 2, 64, LayoutKind::odd_pad});
        check_all_types({Fp4Operand::v, f, rule, false, transposed, 3, 20, 1, 16, LayoutKind::dense});
        check_all_types({Fp4Operand::v, f, rule, false, transposed, 1, 129, 2, 256, LayoutKind::dense});
        // The stream kernel at D = 64 (one channel chunk a head), partial last tile.
        check_all_types({Fp4Operand::v, f, rule, false, transposed, 2, 555, 2, 64, LayoutKind::dense});
      }
    }
}

// Inputs long enough that every warp of the pipelined kernels runs several
// rounds of its copy pipeline (every slot reused, tails in the last round);
// both 16-bit types, both rules, dense and strided; the rows kernel also for
// NVFP4 and smooth_k, whose rounds run backwards, and the columns kernel
// for NVFP4 Vᵀ.
TEST(GpuQuantizeFp4, PipelinedKernelsMatchCpuOverManyRounds) {
  FP4ATTN_REQUIRE_HOPPER();
  for (MxScaleRule rule : kRules) {
    for (Fp4Operand op : {Fp4Operand::q, Fp4Operand::v}) {
      const Case c{op, TensorFormat::mxfp4, rule, false, true, 1, 2053, 8, 128, LayoutKind::dense, true};
      check_case<__nv_bfloat16>(c);
      if (rule == MxScaleRule::round_up) check_case<__half>(c);
    }
    check_case<__nv_bfloat16>({Fp4Operand::k, TensorFormat::mxfp4, rule, false, true, 3, 1031, 5, 64,
                               LayoutKind::qkv_slot, true});
    check_case<__nv_bfloat16>({Fp4Operand::v, TensorFormat::mxfp4, rule, false, true, 3, 1031, 5, 64,
                               LayoutKind::qkv_slot, true});
    check_case<__half>({Fp4Operand::k, TensorFormat::mxfp4, rule, true, true, 2, 1500, 4, 128, LayoutKind::dense, true});
    check_case<__nv_bfloat16>({Fp4Operand::q, TensorFormat::mxfp4, rule, false, true, 2, 700, 3, 64, LayoutKind::dense,
                               true});
  }
  check_case<__nv_bfloat16>(
      {Fp4Operand::v, TensorFormat::nvfp4, MxScaleRule::round_up, false, true, 1, 2053, 8, 128, LayoutKind::dense, true});
  check_case<__half>(
      {Fp4Operand::v, TensorFormat::nvfp4, MxScaleRule::round_up, false, true, 2, 999, 3, 64, LayoutKind::qkv_slot, true});
  for (bool smooth : {false, true}) {
    const Case c{Fp4Operand::k, TensorFormat::nvfp4, MxScaleRule::round_up, smooth, true, 1, 2053, 8, 128,
                 LayoutKind::dense, true};
    check_case<__nv_bfloat16>(c);
    check_case<__half>(c);
    check_case<__nv_bfloat16>({smooth ? Fp4Operand::k : Fp4Operand::q, TensorFormat::nvfp4, MxScaleRule::round_up,
                               smooth, true, 3, 1031, 5, 32, LayoutKind::qkv_slot, true});
  }
}

// smooth_k over many 128-token chunks: the finalize kernels copy the chunk
// sums in slabs of 64 chunks, two slabs ahead of the adds, into three
// buffers. S = 30001 is 235 chunks (every buffer reused, a partial last
// slab); NVFP4's 48 channels (D = 16, H = 3) leave the second group of 32
// channels half empty.
TEST(GpuQuantizeFp4, MeanOverManyChunksMatchesTheCpu) {
  FP4ATTN_REQUIRE_HOPPER();
  for (TensorFormat f : kFormats) {
    check_case<__nv_bfloat16>({Fp4Operand::k, f, MxScaleRule::round_up, true, true, 1, 30001, 2, 64, LayoutKind::dense});
    const int D = f == TensorFormat::nvfp4 ? 16 : 32;  // MXFP4 blocks are 32 channels
    check_case<__half>({Fp4Operand::k, f, MxScaleRule::round_up, true, true, 2, 9000, 3, D, LayoutKind::odd_pad});
  }
}

// Each pass that follows a statistics pass is a programmatic dependent
// launch (NVFP4's amax, smooth_k's mean and its finalize): captured into a
// CUDA graph they become graph edges, and the bits stay the CPU's.
TEST(GpuQuantizeFp4, CapturedInACudaGraphMatchesCpu) {
  FP4ATTN_REQUIRE_HOPPER();
  for (TensorFormat f : kFormats) {
    check_case<__nv_bfloat16>({Fp4Operand::k, f, MxScaleRule::round_up, true, true, 2, 1500, 4, 128, LayoutKind::dense,
                               false},
                              true);
    check_case<__nv_bfloat16>({Fp4Operand::q, f, MxScaleRule::round_up, false, true, 2, 700, 3, 64, LayoutKind::dense,
                               false},
                              true);
  }
  check_case<__nv_bfloat16>(
      {Fp4Operand::v, TensorFormat::nvfp4, MxScaleRule::round_up, false, true, 1, 2053, 8, 128, LayoutKind::dense, false},
      true);
}

// mx_codes_x8 (the packed bf16x2 / f16x2 MXFP4 encoder) on every 16-bit
// pattern whose quotient x · 2^-k is finite and at most 8 in magnitude (all
// that an MX block holds), for scales at both ends of mx_pairs_apply's range
// and in between, against encode_rne_sat(e2m1, ·) of the float product.
template <class T>
__global__ void packed_mx_codes_all_patterns(std::uint32_t scale_code, std::uint32_t* words) {
  const int g = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);  // patterns 8g .. 8g + 7
  if (g >= 65536 / 8) return;
  std::uint32_t p[4];
  for (int j = 0; j < 4; ++j) p[j] = static_cast<std::uint32_t>(8 * g + j) | static_cast<std::uint32_t>(8 * g + j + 4) << 16;
  words[g] = cq::fp4::mx_codes_x8<T>(p, cq::fp4::mx_pair_scale<T>(scale_code));
}

template <class T>
void check_packed_mx_codes(std::uint32_t scale_code) {
  DeviceArray<std::uint32_t> words(65536 / 8);
  packed_mx_codes_all_patterns<T><<<65536 / 8 / 256, 256>>>(scale_code, words.ptr);
  FP4ATTN_CUDA_OK(cudaDeviceSynchronize());
  const std::vector<std::uint32_t> got = words.download();
  const float inv = std::ldexp(1.0f, kE8M0Bias - static_cast<int>(scale_code));
  std::size_t compared = 0, bad = 0;
  std::string first;
  for (std::uint32_t bits = 0; bits < 65536; ++bits) {
    T x;
    const auto half_bits = static_cast<std::uint16_t>(bits);
    std::memcpy(&x, &half_bits, sizeof(x));
    const float q = Elem<T>::to(x) * inv;  // exact: a power of two, the float range is wider
    if (!std::isfinite(q) || std::fabs(q) > 8.0f) continue;
    ++compared;
    const unsigned code = (got[bits / 8] >> (4 * (bits % 8))) & 0xFu;
    const unsigned want = encode_rne_sat(ElemFormat::e2m1, q);
    if (code != want && bad++ == 0)
      first = "pattern " + std::to_string(bits) + " got " + std::to_string(code) + " want " + std::to_string(want);
  }
  EXPECT_GT(compared, 0u);
  EXPECT_EQ(bad, 0u) << Elem<T>::name << " scale code " << scale_code << ": " << bad << " of " << compared
                     << " differ, first " << first;
}

TEST(GpuQuantizeFp4, PackedMxCodesMatchTheCpuOnEveryPattern) {
  FP4ATTN_REQUIRE_HOPPER();
  using BfPairs = cq::fp4::Pairs<__nv_bfloat16>;
  using HalfPairs = cq::fp4::Pairs<__half>;
  for (std::uint32_t code : {BfPairs::kMinScaleCode, 60u, 127u, 130u, BfPairs::kMaxScaleCode})
    check_packed_mx_codes<__nv_bfloat16>(code);
  for (std::uint32_t code : {HalfPairs::kMinScaleCode, 120u, 127u, 129u, HalfPairs::kMaxScaleCode})
    check_packed_mx_codes<__half>(code);
}

// Blocks whose quotients are exact E2M1 ties (ties go to the even code) or
// lie past 6 (saturation), in every operand, format and rule.
TEST(GpuQuantizeFp4, TiesAndSaturationRoundLikeTheCpu) {
  FP4ATTN_REQUIRE_HOPPER();
  for (TensorFormat f : kFormats)
    for (MxScaleRule rule : kRules) {
      if (f == TensorFormat::nvfp4 && rule == MxScaleRule::ocp_floor) continue;
      for (Fp4Operand op : {Fp4Operand::q, Fp4Operand::k, Fp4Operand::v}) {
        Case c{op, f, rule, false, true, 2, 333, 2, 128, LayoutKind::dense, true};
        check_all_types(c);
        c.v_transposed = false;
        if (op == Fp4Operand::v) check_case<__nv_bfloat16>(c);
      }
    }
}

// K = 2^60 at token 0, 2 at tokens 128 .. S − 2, −2^60 at the last token.
// Chunk sums are 2^60, 256 and −2^60: the chunked order keeps the 256, so the
// mean is 256 / 257; one running sum would lose every 2 against 2^60.
TEST(GpuQuantizeFp4, MeanUsesTheChunkedOrder) {
  FP4ATTN_REQUIRE_HOPPER();
  for (TensorFormat f : kFormats) {
    const Case c{Fp4Operand::k, f, MxScaleRule::round_up, true, true, 1, 257, 2, 64, LayoutKind::dense};
    std::vector<float> x(static_cast<std::size_t>(c.B * c.S * c.H * c.D));
    for (std::size_t i = 0; i < x.size(); ++i) {
      const std::int64_t token = static_cast<std::int64_t>(i) / (c.H * c.D);
      x[i] = token == 0 ? 0x1p60f : token == c.S - 1 ? -0x1p60f : token >= kSequenceMeanChunk ? 2.0f : 0.0f;
    }
    const DeviceTensor in(x, c.B, c.S, c.H, c.D, {}, __nv_bfloat16{});
    DeviceOutputs dev(c);
    dev.poison();
    cq::quantize_fp4(in.view, c.op, options_of(c), dev.bufs, nullptr);
    cq::check_finite(dev.bufs, nullptr);
    const float want = static_cast<float>(256.0 / 257.0);
    for (float m : dev.k_mean.download()) ASSERT_EQ(m, want);
    expect_matches_cpu(c, x, dev, std::string("chunked mean ") + std::string(to_string(f)));
  }
}

TEST(GpuQuantizeFp4, ReportsNonFiniteInput) {
  FP4ATTN_REQUIRE_HOPPER();
  const float bad_values[] = {std::nanf(""), INFINITY, -INFINITY};
  const std::uint32_t seed = gpu_test::fresh_seed();
  std::mt19937 rng(seed);
  for (TensorFormat f : kFormats)
    for (Fp4Operand op : {Fp4Operand::q, Fp4Operand::k, Fp4Operand::v})
      for (bool smooth_k : {false, true}) {
        if (smooth_k && op != Fp4Operand::k) continue;
        for (float bad : bad_values) {
          const Case c{op, f, MxScaleRule::round_up, smooth_k, true, 1, 260, 2, 64, LayoutKind::qkv_slot};
          std::vector<float> x = make_input<__nv_bfloat16>(c, rng);
          x[std::uniform_int_distribution<std::size_t>(0, x.size() - 1)(rng)] = bad;
          const DeviceTensor in(x, c.B, c.S, c.H, c.D, layout_of(c.layout, c.H, c.D), __nv_bfloat16{});
          DeviceOutputs dev(c);
          const std::string where = describe(c, "bf16", seed) + " holds " + std::to_string(bad);
          cq::quantize_fp4(in.view, c.op, options_of(c), dev.bufs, nullptr);
          try {
            cq::check_finite(dev.bufs, nullptr);
            ADD_FAILURE() << "not reported: " << where;
          } catch (const Error& e) {
            EXPECT_EQ(e.argument(), op_name(op)) << where;
          }
          // The flags were cleared: clean input passes on the same buffers.
          const std::vector<float> clean = make_input<__nv_bfloat16>(c, rng);
          const DeviceTensor clean_in(clean, c.B, c.S, c.H, c.D, {}, __nv_bfloat16{});
          dev.poison();
          cq::quantize_fp4(clean_in.view, c.op, options_of(c), dev.bufs, nullptr);
          cq::check_finite(dev.bufs, nullptr);
          expect_matches_cpu(c, clean, dev, "after " + where);
        }
      }
}

TEST(GpuQuantizeFp4, RefusesWhatItCannotQuantize) {
  FP4ATTN_REQUIRE_HOPPER();
  const Case c{Fp4Operand::k, TensorFormat::mxfp4, MxScaleRule::round_up, true, true, 1, 40, 2, 64};
  std::mt19937 rng(gpu_test::fresh_seed());
  const std::vector<float> x = make_input<__nv_bfloat16>(c, rng);
  const DeviceTensor in(x, c.B, c.S, c.H, c.D, {}, __nv_bfloat16{});
  DeviceOutputs dev(c);
  auto argument_of_error = [&](cq::StridedInput view, Fp4Operand op, cq::Fp4Options opt, cq::Fp4Buffers bufs) {
    try {
      cq::quantize_fp4(view, op, opt, bufs, nullptr);
    } catch (const Error& e) {
      return e.argument();
    }
    return std::string("nothing");
  };
  const cq::Fp4Options opt = options_of(c);
  cq::StridedInput wide = in.view;
  wide.D = 96;  // not a power of two
  EXPECT_EQ(argument_of_error(wide, Fp4Operand::k, opt, dev.bufs), "D");
  cq::StridedInput narrow = in.view;
  narrow.D = 16;  // below one MXFP4 block along D
  EXPECT_EQ(argument_of_error(narrow, Fp4Operand::k, opt, dev.bufs), "D");
  cq::Fp4Options fp8 = opt;
  fp8.format = TensorFormat::fp8_e4m3;
  EXPECT_EQ(argument_of_error(in.view, Fp4Operand::k, fp8, dev.bufs), "format");
  cq::Fp4Buffers no_mean = dev.bufs;
  no_mean.k_mean = nullptr;
  EXPECT_EQ(argument_of_error(in.view, Fp4Operand::k, opt, no_mean), "smooth_k");
  cq::Fp4Buffers misaligned = dev.bufs;
  misaligned.k.codes += 1;
  EXPECT_EQ(argument_of_error(in.view, Fp4Operand::k, opt, misaligned), "out");
  cq::Fp4Options nv = opt;
  nv.format = TensorFormat::nvfp4;
  cq::Fp4Buffers no_tensor_scale = dev.bufs;
  no_tensor_scale.k.tensor_scale = nullptr;
  EXPECT_EQ(argument_of_error(in.view, Fp4Operand::k, nv, no_tensor_scale), "out");
  EXPECT_EQ(argument_of_error(in.view, Fp4Operand::q, opt, dev.bufs), "out");  // no q buffers given
  cq::StridedInput empty = in.view;
  empty.S = 0;
  EXPECT_EQ(argument_of_error(empty, Fp4Operand::k, opt, dev.bufs), "k");
}

}  // namespace
}  // namespace fp4attn
