// GPU quantizer for recipe fp8 against the CPU quantizer (emulator::quantize_inputs),
// bit for bit: Q, K and V codes and scales, the smooth_k mean, Vᵀ's key
// permutation and zero padding, over bf16, fp16 and fp32 inputs with odd
// lengths, GQA, head dims 16 to 128 and strided layouts (16-byte aligned and
// not); the transposed Q and K codes and the row dot written on request.
// Then known answers (E4M3 ties, the chunked order of the mean), a
// reused workspace starting each call afresh, non-finite input reported by
// tensor name, and arguments the quantizer must refuse.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "cuda/quantize/quantize_fp8.hpp"
#include "fp4attn/emulator.hpp"
#include "fp4attn/error.hpp"
#include "gpu/gpu_test_util.hpp"

namespace fp4attn {
namespace {

namespace cq = cuda_quantize;
using gpu_test::DeviceArray;

// lse_shift is an fp32 dot product over D terms, not a bitwise output: its
// error stays below D · 2^-24 of the sum of |terms| (D ≤ 128).
constexpr double kLseShiftRelTol = 1e-5;
constexpr float kE4M3Top = 448.0f;  // an amax of exactly 448 gives scale 1: quotients are the inputs

// Element padding of a device layout (B, S, H, D): head, token and batch
// strides grow by these many elements and the data starts `offset` elements
// in. Odd pads break 16-byte alignment and take the element-wise loads.
struct Layout {
  std::int64_t head_pad = 0, token_pad = 0, batch_pad = 0, offset = 0;
};
constexpr Layout kDense{};
constexpr Layout kAlignedPad{8, 16, 8, 8};
constexpr Layout kOddPad{3, 5, 7, 1};

template <class T>
struct Elem;
template <>
struct Elem<__nv_bfloat16> {
  static constexpr cq::ElementType type = cq::ElementType::bf16;
  static __nv_bfloat16 from(float x) { return __float2bfloat16_rn(x); }
  static float to(__nv_bfloat16 x) { return __bfloat162float(x); }
};
template <>
struct Elem<__half> {
  static constexpr cq::ElementType type = cq::ElementType::f16;
  static __half from(float x) { return __float2half_rn(x); }
  static float to(__half x) { return __half2float(x); }
};
template <>
struct Elem<float> {
  static constexpr cq::ElementType type = cq::ElementType::f32;
  static float from(float x) { return x; }
  static float to(float x) { return x; }
};

template <class T>
void round_to_element(std::vector<float>& x) {
  for (float& v : x) v = Elem<T>::to(Elem<T>::from(v));
}

// A logical (B, S, H, D) tensor on the device in a padded layout. Padding
// holds NaN: a read outside the tensor would be reported as non-finite input.
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
            host[l.offset + b * sb + s * ss + h * sh + d] = Elem<T>::from(x[((b * S + s) * H + h) * D + d]);
    cudaMemcpy(bytes.ptr, host.data(), bytes.bytes(), cudaMemcpyHostToDevice);
    view = {bytes.ptr + l.offset * sizeof(T), Elem<T>::type, B, S, H, D, sb, ss, sh};
  }
};

// Quantizer outputs, poisoned (0xFF: NaN scales, NaN codes) before each run.
struct DeviceOutputs {
  std::int64_t vt_keys;
  DeviceArray<std::uint8_t> q, k, vt;
  DeviceArray<float> q_scale, k_scale, v_scale, k_mean, lse_shift;
  DeviceArray<int> flags;
  DeviceArray<unsigned char> workspace;
  cq::Fp8Buffers bufs;
  int stats_offset;  // floats before v_scale and k_mean in their arrays (1: only 4-byte aligned)

  // own_workspace: pass a (poisoned) caller workspace; otherwise the quantizer allocates one.
  DeviceOutputs(const AttentionShape& s, bool own_workspace, int stats_offset = 0)
      : vt_keys(cq::padded_keys(s.Sk)),
        q(s.q_elems()),
        k(s.kv_elems()),
        vt(s.B * s.Hkv * s.D * vt_keys),
        q_scale(s.B * s.Hq * ((s.Sq + cq::kTokenBlock - 1) / cq::kTokenBlock)),
        k_scale(s.B * s.Hkv * ((s.Sk + cq::kTokenBlock - 1) / cq::kTokenBlock)),
        v_scale(s.B * s.Hkv * s.D + stats_offset),
        k_mean(s.B * s.Hkv * s.D + stats_offset),
        lse_shift(s.lse_elems()),
        flags(3),
        workspace(cq::fp8_workspace_bytes(s.B, s.Hkv, s.Sk, s.D)),
        stats_offset(stats_offset) {
    poison();
    cudaMemset(workspace.ptr, 0xFF, workspace.bytes());
    cudaMemset(flags.ptr, 0, flags.bytes());
    bufs = {q.ptr,         q_scale.ptr, k.ptr,           k_scale.ptr, vt.ptr,   v_scale.ptr + stats_offset,
            k_mean.ptr + stats_offset, lse_shift.ptr, vt_keys, flags.ptr, own_workspace ? workspace.ptr : nullptr};
  }
  void poison() {
    for (auto* a : {&q, &k, &vt}) a->poison();
    for (auto* a : {&q_scale, &k_scale, &v_scale, &k_mean, &lse_shift}) a->poison();
  }
};

struct Inputs {
  AttentionShape shape;
  std::vector<float> q, k, v;  // exactly the values the device holds
};

template <class T>
struct DeviceInputs {
  DeviceTensor q, k, v;
  DeviceInputs(const Inputs& in, const Layout& l)
      : q(in.q, in.shape.B, in.shape.Sq, in.shape.Hq, in.shape.D, l, T{}),
        k(in.k, in.shape.B, in.shape.Sk, in.shape.Hkv, in.shape.D, l, T{}),
        v(in.v, in.shape.B, in.shape.Sk, in.shape.Hkv, in.shape.D, l, T{}) {}
};

template <class T>
Inputs random_inputs(const AttentionShape& s, std::mt19937& rng) {
  Inputs in{s, gpu_test::attention_input(s.q_elems(), s.D, 0.5f, rng),
            gpu_test::attention_input(s.kv_elems(), s.D, 4.0f, rng),  // the shared offset smooth_k removes
            gpu_test::attention_input(s.kv_elems(), s.D, 1.0f, rng)};
  round_to_element<T>(in.q);
  round_to_element<T>(in.k);
  round_to_element<T>(in.v);
  return in;
}

std::string describe(const AttentionShape& s, bool smooth_k, const char* type, std::uint32_t seed) {
  return std::string(type) + " B=" + std::to_string(s.B) + " Hq=" + std::to_string(s.Hq) +
         " Hkv=" + std::to_string(s.Hkv) + " Sq=" + std::to_string(s.Sq) + " Sk=" + std::to_string(s.Sk) +
         " D=" + std::to_string(s.D) + " smooth_k=" + std::to_string(smooth_k) + " seed=" + std::to_string(seed);
}

void expect_bytes_equal(const std::vector<std::uint8_t>& got, const std::vector<std::uint8_t>& want, const char* what,
                        const std::string& where) {
  ASSERT_EQ(got.size(), want.size()) << what;
  std::size_t bad = 0, first = 0;
  for (std::size_t i = 0; i < got.size(); ++i)
    if (got[i] != want[i] && bad++ == 0) first = i;
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " codes differ, first at " << first << " (got " << int(got[first])
                     << ", want " << int(want[first]) << ") " << where;
}

void expect_floats_bitwise(const std::vector<float>& got, const std::vector<float>& want, const char* what,
                           const std::string& where) {
  ASSERT_EQ(got.size(), want.size()) << what;
  std::size_t bad = 0, first = 0;
  for (std::size_t i = 0; i < got.size(); ++i)
    if (std::memcmp(&got[i], &want[i], sizeof(float)) != 0 && bad++ == 0) first = i;
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " values differ, first at " << first << " (got " << got[first]
                     << ", want " << want[first] << ") " << where;
}

// Vᵀ back to (B, Sk, Hkv, D) codes through the slot → key permutation;
// counts padding slots that do not hold the zero code.
std::vector<std::uint8_t> unpermute_vt(const std::vector<std::uint8_t>& vt, const AttentionShape& s,
                                       std::int64_t vt_keys, std::size_t& bad_padding) {
  std::vector<std::uint8_t> codes(static_cast<std::size_t>(s.kv_elems()));
  bad_padding = 0;
  for (std::int64_t b = 0; b < s.B; ++b)
    for (std::int64_t h = 0; h < s.Hkv; ++h)
      for (std::int64_t d = 0; d < s.D; ++d)
        for (std::int64_t slot = 0; slot < vt_keys; ++slot) {
          const std::int64_t group = slot / cq::kVtKeyGroup * cq::kVtKeyGroup;
          const std::int64_t key = group + cq::vt_key_of_slot(static_cast<int>(slot % cq::kVtKeyGroup));
          const std::uint8_t code = vt[((b * s.Hkv + h) * s.D + d) * vt_keys + slot];
          if (key < s.Sk) codes[bshd_index(s.Sk, s.Hkv, s.D, b, key, h, d)] = code;
          else bad_padding += code != 0;
        }
  return codes;
}

struct Fp8Result {
  std::vector<std::uint8_t> q, k, v;  // v back in (B, Sk, Hkv, D)
  std::vector<float> q_scale, k_scale, v_scale, k_mean, lse_shift;
  std::size_t bad_padding = 0;
};

Fp8Result download(const DeviceOutputs& dev, const AttentionShape& s, bool smooth_k) {
  Fp8Result r;
  r.q = dev.q.download(), r.k = dev.k.download();
  r.v = unpermute_vt(dev.vt.download(), s, dev.vt_keys, r.bad_padding);
  const auto past_offset = [&](std::vector<float> v) {
    v.erase(v.begin(), v.begin() + dev.stats_offset);
    return v;
  };
  r.q_scale = dev.q_scale.download(), r.k_scale = dev.k_scale.download();
  r.v_scale = past_offset(dev.v_scale.download());
  if (smooth_k) r.k_mean = past_offset(dev.k_mean.download()), r.lse_shift = dev.lse_shift.download();
  return r;
}

float softmax_scale_of(const AttentionShape& s) { return 1.0f / std::sqrt(static_cast<float>(s.D)); }

template <class T>
Fp8Result run_gpu(const DeviceInputs<T>& in, const AttentionShape& s, bool smooth_k, DeviceOutputs& dev) {
  dev.poison();
  cq::quantize_fp8(in.q.view, in.k.view, in.v.view, smooth_k, softmax_scale_of(s), dev.bufs, nullptr);
  cq::check_finite(dev.bufs, nullptr);
  return download(dev, s, smooth_k);
}

void expect_same(const Fp8Result& got, const Fp8Result& want, const std::string& where) {
  expect_bytes_equal(got.q, want.q, "q codes", where);
  expect_bytes_equal(got.k, want.k, "k codes", where);
  expect_bytes_equal(got.v, want.v, "v codes", where);
  expect_floats_bitwise(got.q_scale, want.q_scale, "q scales", where);
  expect_floats_bitwise(got.k_scale, want.k_scale, "k scales", where);
  expect_floats_bitwise(got.v_scale, want.v_scale, "v scales", where);
  expect_floats_bitwise(got.k_mean, want.k_mean, "k mean", where);
  expect_floats_bitwise(got.lse_shift, want.lse_shift, "lse shift", where);
}

// Bitwise against the CPU quantizer; lse_shift against the formula in double.
void expect_matches_cpu(const Fp8Result& got, const Inputs& in, bool smooth_k, const std::string& where) {
  const AttentionShape& s = in.shape;
  AttentionOptions opt;
  opt.smooth_k = smooth_k;
  const emulator::QuantizedInputs cpu = emulator::quantize_inputs(s, in.q, in.k, in.v, opt);
  expect_bytes_equal(got.q, cpu.q.codes, "q codes", where);
  expect_bytes_equal(got.k, cpu.k.codes, "k codes", where);
  expect_bytes_equal(got.v, cpu.v.codes, "v codes", where);
  expect_floats_bitwise(got.q_scale, cpu.q.scales, "q scales", where);
  expect_floats_bitwise(got.k_scale, cpu.k.scales, "k scales", where);
  expect_floats_bitwise(got.v_scale, cpu.v.scales, "v scales", where);
  EXPECT_EQ(got.bad_padding, 0u) << "Vᵀ padding keys must hold zero codes " << where;
  if (!smooth_k) return;
  expect_floats_bitwise(got.k_mean, cpu.k_mean, "k mean", where);

  const double scale = softmax_scale_of(s);
  std::size_t bad = 0;
  for (std::int64_t b = 0; b < s.B; ++b)
    for (std::int64_t h = 0; h < s.Hq; ++h)
      for (std::int64_t i = 0; i < s.Sq; ++i) {
        const float* mean = &cpu.k_mean[(b * s.Hkv + h / s.group()) * s.D];
        double dot = 0.0, magnitude = 0.0;
        for (std::int64_t d = 0; d < s.D; ++d) {
          const double term = static_cast<double>(cpu.q.value(b, i, h, d)) * mean[d];
          dot += term, magnitude += std::fabs(term);
        }
        const double got_shift = got.lse_shift[(b * s.Hq + h) * s.Sq + i];
        bad += !(std::fabs(got_shift - scale * dot) <= kLseShiftRelTol * scale * magnitude +
                                                           std::numeric_limits<float>::denorm_min());
      }
  EXPECT_EQ(bad, 0u) << "lse_shift rows off the formula " << where;
}

template <class T>
void check_random_case(const AttentionShape& s, bool smooth_k, const Layout& layout, bool own_workspace,
                       const char* type, int stats_offset = 0) {
  const std::uint32_t seed = gpu_test::fresh_seed();
  std::mt19937 rng(seed);
  const Inputs in = random_inputs<T>(s, rng);
  const DeviceInputs<T> dev_in(in, layout);
  DeviceOutputs dev(s, own_workspace, stats_offset);
  expect_matches_cpu(run_gpu(dev_in, s, smooth_k, dev), in, smooth_k, describe(s, smooth_k, type, seed));
}

TEST(GpuQuantizeFp8, MatchesCpuQuantizerBitForBit) {
  FP4ATTN_REQUIRE_HOPPER();
  // {B, Hq, Hkv, Sq, Sk, D}
  check_random_case<__nv_bfloat16>({2, 4, 2, 300, 257, 128}, true, kAlignedPad, true, "bf16");
  check_random_case<__nv_bfloat16>({1, 2, 1, 128, 1000, 64}, true, kOddPad, false, "bf16");
  check_random_case<__nv_bfloat16>({1, 8, 2, 640, 1500, 128}, true, kDense, true, "bf16");
  check_random_case<__nv_bfloat16>({3, 2, 2, 1, 5, 16}, true, kOddPad, true, "bf16");
  check_random_case<__half>({1, 3, 3, 77, 33, 128}, false, kDense, false, "fp16");
  check_random_case<__half>({2, 2, 1, 129, 385, 32}, true, kOddPad, true, "fp16");
  // D = 32 and 16 with 16-byte loads: CTAs of 64 and 32 threads on the whole-block path.
  check_random_case<__nv_bfloat16>({1, 4, 2, 300, 260, 32}, true, kDense, false, "bf16");
  check_random_case<__half>({2, 2, 2, 130, 257, 16}, false, kAlignedPad, true, "fp16");
  check_random_case<float>({1, 2, 2, 200, 131, 128}, true, kAlignedPad, true, "fp32");
  check_random_case<float>({2, 4, 1, 250, 300, 64}, false, kOddPad, false, "fp32");
  // D = 96, 80 on the lanes of 128, 48 on those of 64: the padded lanes read zeros and write nothing.
  check_random_case<__nv_bfloat16>({2, 4, 2, 300, 257, 96}, true, kDense, true, "bf16");
  check_random_case<__nv_bfloat16>({1, 2, 2, 200, 300, 80}, true, kOddPad, false, "bf16");
  check_random_case<__half>({2, 2, 1, 130, 129, 48}, true, kDense, true, "fp16");
  check_random_case<__half>({1, 3, 1, 129, 385, 96}, false, kOddPad, false, "fp16");
  check_random_case<float>({1, 2, 2, 200, 131, 96}, true, kAlignedPad, true, "fp32");
  // D above 128 on the wide instance's 512 lanes (a token's 32 segments fill a
  // warp): 256 itself, and 160, 192 with the lanes past D padded.
  check_random_case<__nv_bfloat16>({2, 4, 2, 300, 257, 256}, true, kDense, true, "bf16");
  check_random_case<__nv_bfloat16>({1, 2, 2, 200, 300, 160}, true, kOddPad, false, "bf16");
  check_random_case<__half>({1, 3, 1, 129, 385, 192}, false, kAlignedPad, true, "fp16");
  check_random_case<float>({1, 2, 2, 200, 131, 256}, true, kOddPad, true, "fp32");
  check_random_case<float>({2, 2, 1, 77, 140, 224}, false, kDense, false, "fp32");
}

// Q's and K's code rows at a pitch wider than D (Fp8Buffers::code_pitch):
// what the forward asks for at an odd multiple of 8 (40, 72: 48 and 80
// bytes, a stride TMA can address). Each row's first D bytes are the CPU's
// codes, the bytes past D are left as they were (poison), and the rest of
// the output is the call at pitch D, bit for bit.
TEST(GpuQuantizeFp8, CodeRowsAtAWiderPitch) {
  FP4ATTN_REQUIRE_HOPPER();
  // {B, Hq, Hkv, Sq, Sk, D}
  for (const AttentionShape s : {AttentionShape{2, 4, 2, 300, 257, 72}, AttentionShape{1, 2, 1, 129, 385, 40},
                                 AttentionShape{1, 3, 3, 77, 200, 24}, AttentionShape{1, 2, 2, 200, 131, 200}})
    for (bool smooth_k : {false, true}) {
      const std::uint32_t seed = gpu_test::fresh_seed();
      std::mt19937 rng(seed);
      const Inputs in = random_inputs<__nv_bfloat16>(s, rng);
      const DeviceInputs<__nv_bfloat16> dev_in(in, kOddPad);
      const std::string where = describe(s, smooth_k, "bf16", seed);
      const std::int64_t pitch = cq::tma_code_pitch(s.D);
      ASSERT_GT(pitch, s.D) << where;
      ASSERT_EQ(pitch % 16, 0) << where;

      DeviceOutputs at_d(s, true);
      const Fp8Result want = run_gpu(dev_in, s, smooth_k, at_d);
      expect_matches_cpu(want, in, smooth_k, where);

      DeviceOutputs wide(s, true);
      DeviceArray<std::uint8_t> q_rows(static_cast<std::size_t>(s.q_elems() / s.D * pitch));
      DeviceArray<std::uint8_t> k_rows(static_cast<std::size_t>(s.kv_elems() / s.D * pitch));
      q_rows.poison(), k_rows.poison();
      wide.bufs.q = q_rows.ptr, wide.bufs.k = k_rows.ptr, wide.bufs.code_pitch = pitch;
      Fp8Result got = run_gpu(dev_in, s, smooth_k, wide);
      // Rows back to pitch D; every byte past D must still be the poison.
      const auto unpitch = [&](const std::vector<std::uint8_t>& rows, const char* what) {
        std::vector<std::uint8_t> codes;
        std::size_t touched = 0;
        for (std::size_t r = 0; r < rows.size() / pitch; ++r) {
          codes.insert(codes.end(), rows.begin() + r * pitch, rows.begin() + r * pitch + s.D);
          for (std::int64_t c = s.D; c < pitch; ++c) touched += rows[r * pitch + c] != 0xFF;
        }
        EXPECT_EQ(touched, 0u) << what << ": bytes past D written " << where;
        return codes;
      };
      got.q = unpitch(q_rows.download(), "q");
      got.k = unpitch(k_rows.download(), "k");
      expect_same(got, want, where);
    }
}

// Many blocks (2560 quantize CTAs, 512 statistics chunks), with K's mean and
// V's scales at 16-byte aligned addresses and at a 4-byte offset.
TEST(GpuQuantizeFp8, ManyBlocksMatchTheCpu) {
  FP4ATTN_REQUIRE_HOPPER();
  const AttentionShape s{4, 16, 8, 512, 2048, 128};
  check_random_case<__nv_bfloat16>(s, true, kDense, true, "bf16", 0);
  check_random_case<__nv_bfloat16>(s, true, kDense, false, "bf16, statistics at a 4-byte offset", 1);
}

// A workspace reused by calls on different inputs: each call starts its
// statistics afresh (a V amax left from the previous call would raise the
// scales), and the same input gives the same bits again.
TEST(GpuQuantizeFp8, ReusedWorkspaceGivesEachCallItsOwnResult) {
  FP4ATTN_REQUIRE_HOPPER();
  for (const AttentionShape s : {AttentionShape{2, 4, 4, 100, 700, 64}, AttentionShape{1, 4, 2, 100, 2300, 64}})
  for (bool smooth_k : {true, false}) {
    const std::uint32_t seed = gpu_test::fresh_seed();
    std::mt19937 rng(seed);
    Inputs loud = random_inputs<__nv_bfloat16>(s, rng);
    // Larger V amax and another K mean than the next call's; powers of two
    // keep the values exact in bf16.
    for (float& x : loud.v) x *= 64.0f;
    for (float& x : loud.k) x *= 16.0f;
    const Inputs quiet = random_inputs<__nv_bfloat16>(s, rng);
    const DeviceInputs<__nv_bfloat16> loud_in(loud, kDense), quiet_in(quiet, kDense);
    DeviceOutputs dev(s, true);
    const std::string where = describe(s, smooth_k, "bf16", seed);
    expect_matches_cpu(run_gpu(loud_in, s, smooth_k, dev), loud, smooth_k, where + " (first call)");
    const Fp8Result second = run_gpu(quiet_in, s, smooth_k, dev);
    expect_matches_cpu(second, quiet, smooth_k, where + " (second call, same workspace)");
    expect_same(run_gpu(quiet_in, s, smooth_k, dev), second, where + " (third call, the second's input)");
  }
}

// The quantizer's three kernels captured into a CUDA graph (the second and
// third are programmatic dependent launches, graph edges there): the same
// bits as the CPU, with and without smooth_k.
TEST(GpuQuantizeFp8, CapturedInACudaGraphMatchesTheCpu) {
  FP4ATTN_REQUIRE_HOPPER();
  const AttentionShape s{2, 4, 2, 300, 700, 128};
  for (bool smooth_k : {true, false}) {
    const std::uint32_t seed = gpu_test::fresh_seed();
    std::mt19937 rng(seed);
    const Inputs in = random_inputs<__nv_bfloat16>(s, rng);
    const DeviceInputs<__nv_bfloat16> dev_in(in, kDense);
    DeviceOutputs dev(s, true);
    dev.poison();
    gpu_test::run_as_graph([&](cudaStream_t stream) {
      cq::quantize_fp8(dev_in.q.view, dev_in.k.view, dev_in.v.view, smooth_k, softmax_scale_of(s), dev.bufs, stream);
    });
    cq::check_finite(dev.bufs, nullptr);
    expect_matches_cpu(download(dev, s, smooth_k), in, smooth_k, describe(s, smooth_k, "bf16", seed) + " (graph)");
  }
}

// Inputs whose quotients sit exactly on E4M3 rounding boundaries: every block
// and V channel holds 448, so every scale is 1 and x / scale = x. The other
// values are ties (ties go to the even code), values just off a tie, and
// subnormal ties.
TEST(GpuQuantizeFp8, TiesRoundLikeTheCpu) {
  FP4ATTN_REQUIRE_HOPPER();
  const AttentionShape s{1, 2, 2, 300, 300, 64};
  const float values[] = {17.0f,  -17.0f, 9.0f,    4.5f,     0.53125f, 0x1p-10f, 3 * 0x1p-10f, -0x1p-10f,
                          200.0f, 432.0f, -432.0f, 440.0f,   18.0f,    0.0f,     -0.0f,        19.0f};
  std::mt19937 rng(gpu_test::fresh_seed());
  std::uniform_int_distribution<int> pick(0, static_cast<int>(std::size(values)) - 1);
  auto make = [&](std::int64_t S, std::int64_t H) {
    std::vector<float> x(static_cast<std::size_t>(s.B * S * H * s.D));
    for (std::int64_t i = 0; i < static_cast<std::int64_t>(x.size()); ++i) {
      const std::int64_t token = i / (H * s.D) % S;
      x[i] = token % cq::kTokenBlock == 0 ? kE4M3Top : values[pick(rng)];
    }
    return x;
  };
  const Inputs in{s, make(s.Sq, s.Hq), make(s.Sk, s.Hkv), make(s.Sk, s.Hkv)};
  const DeviceInputs<__nv_bfloat16> dev_in(in, kDense);
  DeviceOutputs dev(s, true);
  const Fp8Result got = run_gpu(dev_in, s, false, dev);
  for (float scale : got.q_scale) ASSERT_EQ(scale, 1.0f);
  for (float scale : got.v_scale) ASSERT_EQ(scale, 1.0f);
  expect_matches_cpu(got, in, false, "E4M3 ties");
}

// K = 2^60 at token 0, 2 at tokens 128 .. Sk − 2, -2^60 at token Sk − 1 (alone
// in the last chunk). At Sk = 257 the chunk sums are 2^60, 256 and -2^60: the
// chunked order keeps the 256, so the mean is 256 / 257; one running sum
// would lose every 2 against 2^60 and give 0. Sk = 2305: 19 chunks, the
// running total stays exact (multiples of 256 below 2^61). Sk = 30081: 236
// chunks, which the finalize kernel adds in four slabs; as in the others the
// last chunk holds the last token alone, so its sum is exact too.
TEST(GpuQuantizeFp8, MeanUsesTheChunkedOrder) {
  FP4ATTN_REQUIRE_HOPPER();
  for (const std::int64_t Sk : {257, 2305, 30081}) {
    const AttentionShape s{1, 2, 2, 64, Sk, 64};
    std::mt19937 rng(gpu_test::fresh_seed());
    Inputs in = random_inputs<__nv_bfloat16>(s, rng);
    for (std::int64_t i = 0; i < s.kv_elems(); ++i) {
      const std::int64_t token = i / (s.Hkv * s.D);
      in.k[i] = token == 0 ? 0x1p60f : token == s.Sk - 1 ? -0x1p60f : token >= cq::kTokenBlock ? 2.0f : 0.0f;
    }
    const DeviceInputs<__nv_bfloat16> dev_in(in, kDense);
    DeviceOutputs dev(s, false);
    const Fp8Result got = run_gpu(dev_in, s, true, dev);
    const float want = static_cast<float>(2.0 * static_cast<double>(Sk - 1 - cq::kTokenBlock) / static_cast<double>(Sk));
    for (float m : got.k_mean) ASSERT_EQ(m, want) << "Sk=" << Sk;
    expect_matches_cpu(got, in, true, "chunked mean, Sk=" + std::to_string(Sk));
  }
}

// Key lengths of 1, 8, 9, 16 and 17 token blocks (full and partial last
// blocks), with and without smooth_k, bf16 and fp16, GQA.
TEST(GpuQuantizeFp8, BlockCountsMatchTheCpu) {
  FP4ATTN_REQUIRE_HOPPER();
  for (const std::int64_t Sk : {100, 1024, 1025, 2048, 2049}) {
    check_random_case<__nv_bfloat16>({2, 4, 2, 150, Sk, 128}, true, kDense, Sk % 2 == 0, "bf16");
    check_random_case<__half>({1, 2, 1, 70, Sk, 64}, Sk % 2 == 0, kOddPad, false, "fp16");
  }
}

TEST(GpuQuantizeFp8, ReportsNonFiniteInput) {
  FP4ATTN_REQUIRE_HOPPER();
  const float bad_values[] = {std::nanf(""), INFINITY, -INFINITY};
  const std::uint32_t seed = gpu_test::fresh_seed();
  std::mt19937 rng(seed);
  for (const AttentionShape& s : {AttentionShape{1, 2, 2, 130, 260, 64}, AttentionShape{1, 2, 2, 130, 260, 256}})
    for (const char* name : {"q", "k", "v"})
      for (float bad : bad_values)
        for (bool smooth_k : {true, false}) {
          Inputs in = random_inputs<__nv_bfloat16>(s, rng);
          std::vector<float>& x = name[0] == 'q' ? in.q : name[0] == 'k' ? in.k : in.v;
          x[std::uniform_int_distribution<std::size_t>(0, x.size() - 1)(rng)] = bad;
          const DeviceInputs<__nv_bfloat16> dev_in(in, kAlignedPad);
          DeviceOutputs dev(s, true);
          const std::string where = std::string(name) + " holds " + std::to_string(bad) + " D=" + std::to_string(s.D) +
                                    " smooth_k=" + std::to_string(smooth_k) + " seed=" + std::to_string(seed);
          cq::quantize_fp8(dev_in.q.view, dev_in.k.view, dev_in.v.view, smooth_k, 0.125f, dev.bufs, nullptr);
          try {
            cq::check_finite(dev.bufs, nullptr);
            ADD_FAILURE() << "not reported: " << where;
          } catch (const Error& e) {
            EXPECT_EQ(e.argument(), name) << where;
          }
          // The flags were cleared: clean input passes on the same buffers.
          const Inputs clean = random_inputs<__nv_bfloat16>(s, rng);
          const DeviceInputs<__nv_bfloat16> clean_in(clean, kAlignedPad);
          expect_matches_cpu(run_gpu(clean_in, s, smooth_k, dev), clean, smooth_k, "after " + where);
        }
}

// Null q and k code buffers (recipe mxfp4_train's call): Vᵀ and its scales
// are those of the full call, and the Q and K outputs are never written (at
// D = 128 and on the wide instance's lanes at 256).
TEST(GpuQuantizeFp8, VOnlyCallWritesVAlone) {
  FP4ATTN_REQUIRE_HOPPER();
  for (const std::int64_t d : {128, 256}) {
    const AttentionShape s{2, 4, 2, 200, 333, d};
    const std::uint32_t seed = gpu_test::fresh_seed();
    std::mt19937 rng(seed);
    const Inputs in = random_inputs<__nv_bfloat16>(s, rng);
    const DeviceInputs<__nv_bfloat16> dev_in(in, kOddPad);
    DeviceOutputs full(s, true), v_only(s, true);
    const Fp8Result want = run_gpu(dev_in, s, false, full);
    expect_matches_cpu(want, in, false, "full call, seed " + std::to_string(seed));

    v_only.poison();
    cq::Fp8Buffers bufs = v_only.bufs;
    bufs.q = bufs.k = nullptr;
    cq::quantize_fp8(dev_in.q.view, dev_in.k.view, dev_in.v.view, false, softmax_scale_of(s), bufs, nullptr);
    cq::check_finite(bufs, nullptr);
    const Fp8Result got = download(v_only, s, false);
    const std::string where = "V-only call, D " + std::to_string(d) + ", seed " + std::to_string(seed);
    expect_bytes_equal(got.v, want.v, "v codes", where);
    expect_floats_bitwise(got.v_scale, want.v_scale, "v scales", where);
    EXPECT_EQ(got.bad_padding, 0u) << where;
    // Still the poison (0xFF) everywhere Q and K would have gone.
    for (const auto* codes : {&got.q, &got.k})
      EXPECT_EQ(std::count(codes->begin(), codes->end(), std::uint8_t{0xFF}),
                static_cast<std::ptrdiff_t>(codes->size()))
          << where;
    for (const auto* scales : {&got.q_scale, &got.k_scale})
      EXPECT_EQ(std::count_if(scales->begin(), scales->end(), [](float x) { return std::isnan(x); }),
                static_cast<std::ptrdiff_t>(scales->size()))
          << where;

    // Half a pair of code buffers, or smooth_k without Q and K, is refused by name.
    cq::Fp8Buffers half = v_only.bufs;
    half.q = nullptr;
    try {
      cq::quantize_fp8(dev_in.q.view, dev_in.k.view, dev_in.v.view, false, 0.125f, half, nullptr);
      ADD_FAILURE() << "a null q with a non-null k was accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.argument(), "out");
    }
    try {
      cq::quantize_fp8(dev_in.q.view, dev_in.k.view, dev_in.v.view, true, 0.125f, bufs, nullptr);
      ADD_FAILURE() << "smooth_k was accepted on a V-only call";
    } catch (const Error& e) {
      EXPECT_EQ(e.argument(), "smooth_k");
    }
  }
}

// Without out.vt (the backward's calls) V is skipped: Q and K, their scales,
// k_mean and lse_shift are those of a full call, with smooth_k on and off,
// and V's outputs keep their poison.
TEST(GpuQuantizeFp8, CallWithoutVWritesQAndKAlone) {
  FP4ATTN_REQUIRE_HOPPER();
  const AttentionShape s{2, 4, 2, 200, 333, 128};
  const std::uint32_t seed = gpu_test::fresh_seed();
  std::mt19937 rng(seed);
  const Inputs in = random_inputs<__nv_bfloat16>(s, rng);
  const DeviceInputs<__nv_bfloat16> dev_in(in, kOddPad);
  for (const bool smooth_k : {true, false}) {
    DeviceOutputs full(s, true), no_v(s, true);
    const Fp8Result want = run_gpu(dev_in, s, smooth_k, full);
    const std::string where = std::string("call without V, smooth_k ") + (smooth_k ? "on" : "off") + ", seed " +
                              std::to_string(seed);
    expect_matches_cpu(want, in, smooth_k, "full call: " + where);
    no_v.poison();
    cq::Fp8Buffers bufs = no_v.bufs;
    bufs.vt = nullptr;
    bufs.v_scale = nullptr;
    cq::quantize_fp8(dev_in.q.view, dev_in.k.view, dev_in.v.view, smooth_k, softmax_scale_of(s), bufs, nullptr);
    cq::check_finite(bufs, nullptr);
    const Fp8Result got = download(no_v, s, smooth_k);
    expect_bytes_equal(got.q, want.q, "q codes", where);
    expect_bytes_equal(got.k, want.k, "k codes", where);
    expect_floats_bitwise(got.q_scale, want.q_scale, "q scales", where);
    expect_floats_bitwise(got.k_scale, want.k_scale, "k scales", where);
    expect_floats_bitwise(got.k_mean, want.k_mean, "k mean", where);
    expect_floats_bitwise(got.lse_shift, want.lse_shift, "lse shift", where);
    const std::vector<std::uint8_t> vt = no_v.vt.download();
    EXPECT_EQ(std::count(vt.begin(), vt.end(), std::uint8_t{0xFF}), static_cast<std::ptrdiff_t>(vt.size())) << where;
    EXPECT_EQ(std::count_if(got.v_scale.begin(), got.v_scale.end(), [](float x) { return std::isnan(x); }),
              static_cast<std::ptrdiff_t>(got.v_scale.size()))
        << where;
  }
  // No code buffer at all is refused by name.
  DeviceOutputs none(s, true);
  cq::Fp8Buffers empty = none.bufs;
  empty.q = empty.k = empty.vt = nullptr;
  try {
    cq::quantize_fp8(dev_in.q.view, dev_in.k.view, dev_in.v.view, false, 0.125f, empty, nullptr);
    ADD_FAILURE() << "a call without any code buffer was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), "out");
  }
}

// (B, S, H, D) codes in the transposed layout the quantizer writes on
// request: (B, H, D, padded_keys(S)), slot k of each 32-token group holding
// token vt_key_of_slot(k), zero codes past S.
std::vector<std::uint8_t> transposed_by_rule(const std::vector<std::uint8_t>& codes, std::int64_t B, std::int64_t S,
                                             std::int64_t H, std::int64_t D) {
  const std::int64_t padded = cq::padded_keys(S);
  std::vector<std::uint8_t> out(static_cast<std::size_t>(B * H * D * padded));
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t h = 0; h < H; ++h)
      for (std::int64_t d = 0; d < D; ++d)
        for (std::int64_t slot = 0; slot < padded; ++slot) {
          const std::int64_t token =
              slot / cq::kVtKeyGroup * cq::kVtKeyGroup + cq::vt_key_of_slot(static_cast<int>(slot % cq::kVtKeyGroup));
          out[static_cast<std::size_t>(((b * H + h) * D + d) * padded + slot)] =
              token < S ? codes[static_cast<std::size_t>(bshd_index(S, H, D, b, token, h, d))] : 0;
        }
  return out;
}

// With out.qt and out.kt (the backward's first call) the quantizer also
// writes the transposed Q and K codes: byte for byte the transposition of
// the codes it writes, which are those of a call without them. smooth_k on
// gives K's padding tokens a nonzero code unless they are masked. Lengths
// end in partial blocks; head dims 16, 64 and 128 take different thread
// layouts; f32 runs two CTAs per SM, bf16 three. Outputs start poisoned.
TEST(GpuQuantizeFp8, TransposedCodesAreTheCodesTransposed) {
  FP4ATTN_REQUIRE_HOPPER();
  const std::uint32_t seed = gpu_test::fresh_seed();
  std::mt19937 rng(seed);
  const auto check = [&](auto element, const AttentionShape& s, bool smooth_k, const Layout& layout) {
    using T = decltype(element);
    const Inputs in = random_inputs<T>(s, rng);
    const DeviceInputs<T> dev_in(in, layout);
    const std::string where = describe(s, smooth_k, sizeof(T) == 2 ? "16-bit" : "f32", seed);
    DeviceOutputs plain(s, true), with_t(s, true);
    const Fp8Result want = run_gpu(dev_in, s, smooth_k, plain);
    DeviceArray<std::uint8_t> qt(s.B * s.Hq * s.D * cq::padded_keys(s.Sq)), kt(s.B * s.Hkv * s.D * cq::padded_keys(s.Sk));
    qt.poison(), kt.poison();
    with_t.bufs.qt = qt.ptr, with_t.bufs.kt = kt.ptr;
    const Fp8Result got = run_gpu(dev_in, s, smooth_k, with_t);
    expect_same(got, want, where);
    expect_bytes_equal(qt.download(), transposed_by_rule(got.q, s.B, s.Sq, s.Hq, s.D), "q codes transposed", where);
    expect_bytes_equal(kt.download(), transposed_by_rule(got.k, s.B, s.Sk, s.Hkv, s.D), "k codes transposed", where);
  };
  for (const bool smooth_k : {true, false}) {
    check(__nv_bfloat16{}, AttentionShape{2, 4, 2, 200, 333, 128}, smooth_k, kOddPad);
    check(__nv_bfloat16{}, AttentionShape{1, 3, 3, 129, 100, 64}, smooth_k, kDense);
    check(float{}, AttentionShape{1, 2, 1, 300, 257, 16}, smooth_k, kAlignedPad);
  }
}

// QRowDot, the sum the kernel forms: per token, each lane of D / 8 takes its
// eight channels by fp32 fma in order, then the lanes' sums meet in a
// butterfly (lane g adds lane g ^ 1, then g ^ 2, ...); lane 0's is kept.
std::vector<float> row_dot_by_rule(const std::vector<float>& q, const std::vector<float>& w, const AttentionShape& s,
                                   std::int64_t pitch) {
  std::vector<float> out(static_cast<std::size_t>(s.B * s.Hq * pitch), 0.0f);
  const int lanes = static_cast<int>(s.D / 8);
  for (std::int64_t b = 0; b < s.B; ++b)
    for (std::int64_t h = 0; h < s.Hq; ++h)
      for (std::int64_t t = 0; t < s.Sq; ++t) {
        std::vector<float> lane(static_cast<std::size_t>(lanes), 0.0f);
        for (int g = 0; g < lanes; ++g)
          for (int e = 0; e < 8; ++e) {
            const std::size_t i = static_cast<std::size_t>(bshd_index(s.Sq, s.Hq, s.D, b, t, h, 8 * g + e));
            lane[g] = std::fma(q[i], w[i], lane[g]);
          }
        for (int m = 1; m < lanes; m <<= 1) {
          std::vector<float> next(lane);
          for (int g = 0; g < lanes; ++g) next[g] = lane[g] + lane[g ^ m];
          lane = next;
        }
        out[static_cast<std::size_t>((b * s.Hq + h) * pitch + t)] = lane[0];
      }
  return out;
}

// The backward's delta = Σ dO·O comes from the dO call's QRowDot: bit for
// bit the rule above for every row, 0 on the rows from Sq to the next
// multiple of 128, and nothing written beyond them (the pitch's tail keeps
// its poison). The codes are those of a call without it. Head dims 16, 64
// and 128; 16-byte loads and element-wise ones (odd strides); bf16 and f32.
TEST(GpuQuantizeFp8, RowDotIsTheSumOfProductsInItsOrder) {
  FP4ATTN_REQUIRE_HOPPER();
  const std::uint32_t seed = gpu_test::fresh_seed();
  std::mt19937 rng(seed);
  const auto check = [&](auto element, const AttentionShape& s, const Layout& layout) {
    using T = decltype(element);
    const Inputs in = random_inputs<T>(s, rng);
    std::vector<float> with = gpu_test::attention_input(s.q_elems(), s.D, 1.0f, rng);
    round_to_element<T>(with);
    const DeviceInputs<T> dev_in(in, layout);
    const DeviceTensor dev_with(with, s.B, s.Sq, s.Hq, s.D, layout, T{});
    const std::string where = describe(s, false, sizeof(T) == 2 ? "bf16" : "f32", seed);
    const std::int64_t pitch = cq::padded_keys(s.Sq) + 64;  // a tail past the padded rows
    DeviceArray<float> dot(s.B * s.Hq * pitch);
    dot.poison();
    DeviceOutputs plain(s, true), with_dot(s, true);
    const Fp8Result want = run_gpu(dev_in, s, false, plain);
    with_dot.poison();
    cq::QRowDot row_dot;
    row_dot.with = dev_with.view, row_dot.out = dot.ptr, row_dot.pitch = pitch;
    cq::quantize_fp8(dev_in.q.view, dev_in.k.view, dev_in.v.view, false, softmax_scale_of(s), with_dot.bufs, row_dot,
                     nullptr);
    cq::check_finite(with_dot.bufs, nullptr);
    expect_same(download(with_dot, s, false), want, where);
    const std::vector<float> got = dot.download();
    std::vector<float> expected = row_dot_by_rule(in.q, with, s, pitch);
    std::size_t tail_written = 0;
    for (std::int64_t row = 0; row < s.B * s.Hq; ++row)
      for (std::int64_t t = cq::padded_keys(s.Sq); t < pitch; ++t) {
        const std::size_t i = static_cast<std::size_t>(row * pitch + t);
        tail_written += !std::isnan(got[i]);
        expected[i] = got[i];  // compared above
      }
    EXPECT_EQ(tail_written, 0u) << "row dot written past the padded rows " << where;
    expect_floats_bitwise(got, expected, "row dot", where);
  };
  check(__nv_bfloat16{}, AttentionShape{2, 4, 2, 200, 333, 128}, kDense);
  check(__nv_bfloat16{}, AttentionShape{1, 3, 3, 129, 100, 64}, kOddPad);
  check(float{}, AttentionShape{1, 2, 1, 300, 257, 16}, kAlignedPad);
  check(float{}, AttentionShape{2, 2, 2, 77, 77, 128}, kOddPad);
}

TEST(GpuQuantizeFp8, RefusesWhatItCannotQuantize) {
  FP4ATTN_REQUIRE_HOPPER();
  const AttentionShape s{1, 2, 2, 40, 40, 64};
  std::mt19937 rng(gpu_test::fresh_seed());
  const Inputs in = random_inputs<__nv_bfloat16>(s, rng);
  const DeviceInputs<__nv_bfloat16> dev_in(in, kDense);
  DeviceOutputs dev(s, true);
  auto argument_of_error = [&](cq::StridedInput q, cq::StridedInput k, cq::StridedInput v, cq::Fp8Buffers bufs) {
    try {
      cq::quantize_fp8(q, k, v, true, 0.125f, bufs, nullptr);
    } catch (const Error& e) {
      return e.argument();
    }
    return std::string("nothing");
  };
  cq::StridedInput wide_q = dev_in.q.view, wide_k = dev_in.k.view, wide_v = dev_in.v.view;
  wide_q.D = wide_k.D = wide_v.D = 44;  // no multiple of 8
  EXPECT_EQ(argument_of_error(wide_q, wide_k, wide_v, dev.bufs), "D");
  // D = 96 quantizes the forward's operands only: not the backward's transposed copies.
  cq::StridedInput q96 = dev_in.q.view, k96 = dev_in.k.view, v96 = dev_in.v.view;
  q96.D = k96.D = v96.D = 96;
  cq::Fp8Buffers with_qt = dev.bufs;
  with_qt.qt = dev.vt.ptr;
  EXPECT_EQ(argument_of_error(q96, k96, v96, with_qt), "D");
  cq::StridedInput q256 = dev_in.q.view, k256 = dev_in.k.view, v256 = dev_in.v.view;  // nor above 128
  q256.D = k256.D = v256.D = 256;
  EXPECT_EQ(argument_of_error(q256, k256, v256, with_qt), "D");
  cq::StridedInput q272 = dev_in.q.view, k272 = dev_in.k.view, v272 = dev_in.v.view;  // nor any op above 256
  q272.D = k272.D = v272.D = 272;
  EXPECT_EQ(argument_of_error(q272, k272, v272, dev.bufs), "D");
  cq::StridedInput half_v = dev_in.v.view;
  half_v.type = cq::ElementType::f16;
  EXPECT_EQ(argument_of_error(dev_in.q.view, dev_in.k.view, half_v, dev.bufs), "dtype");
  cq::Fp8Buffers short_vt = dev.bufs;
  short_vt.vt_keys = s.Sk;
  EXPECT_EQ(argument_of_error(dev_in.q.view, dev_in.k.view, dev_in.v.view, short_vt), "vt_keys");
  cq::Fp8Buffers odd_qt = dev.bufs;
  odd_qt.qt = dev.vt.ptr + 8;  // 8-byte aligned: transposed rows are stored 16 bytes at a time
  EXPECT_EQ(argument_of_error(dev_in.q.view, dev_in.k.view, dev_in.v.view, odd_qt), "out");
  // Code rows narrower than D, at a pitch that is no multiple of 8, or wider
  // than D with the backward's operands (which read them at D).
  for (std::int64_t pitch : {std::int64_t{56}, std::int64_t{68}}) {
    cq::Fp8Buffers bad_pitch = dev.bufs;
    bad_pitch.code_pitch = pitch;
    EXPECT_EQ(argument_of_error(dev_in.q.view, dev_in.k.view, dev_in.v.view, bad_pitch), "code_pitch") << pitch;
  }
  cq::Fp8Buffers wide_with_qt = dev.bufs;
  wide_with_qt.qt = dev.vt.ptr, wide_with_qt.code_pitch = 80;
  EXPECT_EQ(argument_of_error(dev_in.q.view, dev_in.k.view, dev_in.v.view, wide_with_qt), "code_pitch");
  // A row dot whose partner differs from q in shape, or whose rows are short.
  DeviceArray<float> dot(s.B * s.Hq * cq::padded_keys(s.Sq));
  const auto row_dot_error = [&](cq::StridedInput with, std::int64_t pitch) {
    try {
      cq::quantize_fp8(dev_in.q.view, dev_in.k.view, dev_in.v.view, false, 0.125f, dev.bufs,
                       cq::QRowDot{with, dot.ptr, pitch}, nullptr);
    } catch (const Error& e) {
      return e.argument();
    }
    return std::string("nothing");
  };
  cq::StridedInput short_with = dev_in.q.view;
  short_with.S = s.Sq - 1;
  EXPECT_EQ(row_dot_error(short_with, cq::padded_keys(s.Sq)), "q_row_dot.with");
  EXPECT_EQ(row_dot_error(dev_in.q.view, s.Sq), "q_row_dot.pitch");
  cq::StridedInput odd_heads_q = dev_in.q.view;
  odd_heads_q.H = 3;  // not a multiple of Hkv = 2
  EXPECT_EQ(argument_of_error(odd_heads_q, dev_in.k.view, dev_in.v.view, dev.bufs), "Hq");
}

}  // namespace
}  // namespace fp4attn
