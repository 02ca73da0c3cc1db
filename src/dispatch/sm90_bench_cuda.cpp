// Device timing of the sm90 fp8 forward in a CUDA build (DESIGN §8): random
// bf16 inputs made on the GPU, quantized once for op fwd and inside the timed
// region for op fwd_e2e; op fwd_e4m3 takes the quantized Q and K codes (K's
// also as V's) as caller-quantized E4M3 tensors with per-head descales, and
// times the device entry for them (its preparation pass, then the kernel);
// CUDA events around each run, warm-up first, median.
// With BenchOptions::training also the training path through the device entry
// points, as the torch layer runs it: the forward from bf16 keeping Q's and
// K's operands, the backward on them from a bf16 dO in the faster of its two
// modes for the problem (sm90_backward_one_pass_faster), as torch picks it
// while deterministic algorithms are off.
#if defined(FP4ATTN_HAS_CUDA)

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <vector>

#include "cuda/common/device_memory.hpp"
#include "cuda/common/random_fill.hpp"
#include "cuda/quantize/quantize_fp8.hpp"
#include "cuda/sm90/fwd/fp8_operands.hpp"
#include "dispatch/sm90_executor.hpp"

namespace fp4attn::dispatch {
namespace {

using cuda_common::check_cuda;
using cuda_common::DeviceMemory;

// Tiny problems would need thousands of sets to cover L2; beyond this many
// they are launch-bound anyway, and the reported rotated_bytes shows the shortfall.
constexpr int kMaxInputSets = 64;
constexpr int kMinInputSets = 2;
constexpr std::size_t kBf16Bytes = 2;
constexpr std::uint64_t kTensorsPerSet = 3;  // q, k, v: one seed each

struct EventDestroy {
  void operator()(cudaEvent_t e) const noexcept { cudaEventDestroy(e); }
};
using Event = std::unique_ptr<CUevent_st, EventDestroy>;

Event make_event() {
  cudaEvent_t e = nullptr;
  check_cuda(cudaEventCreate(&e), "cudaEventCreate");
  return Event(e);
}

// Sets such that, between two runs on one set, the others stream more than
// L2 through it: no run starts with its operands cached.
int input_sets(std::size_t set_bytes, std::size_t l2_bytes) {
  const std::size_t others = (l2_bytes + set_bytes) / set_bytes;  // > l2_bytes in total
  return static_cast<int>(std::clamp<std::size_t>(others + 1, kMinInputSets, kMaxInputSets));
}

// A bf16 (B, S, H, D) input set, contiguous.
struct Bf16Inputs {
  DeviceMemory q, k, v;
};

cuda_quantize::StridedInput bf16_input(const DeviceMemory& data, std::int64_t B, std::int64_t S, std::int64_t H,
                                       std::int64_t D) {
  return {data.get(), cuda_quantize::ElementType::bf16, B, S, H, D, S * H * D, H * D, D};
}

// Median of `reps` event-timed calls of run(i), after `warmup` untimed ones;
// i counts all calls so that the caller can rotate inputs.
template <class Run>
double median_ms(const Run& run, int reps, int warmup, cudaStream_t stream) {
  for (int i = 0; i < warmup; ++i) run(i);
  std::vector<Event> start, stop;
  for (int i = 0; i < reps; ++i) {
    start.push_back(make_event());
    stop.push_back(make_event());
  }
  for (int i = 0; i < reps; ++i) {
    check_cuda(cudaEventRecord(start[i].get(), stream), "cudaEventRecord");
    run(warmup + i);
    check_cuda(cudaEventRecord(stop[i].get(), stream), "cudaEventRecord");
  }
  check_cuda(cudaEventSynchronize(stop.back().get()), "timed runs");
  std::vector<double> ms(reps);
  for (int i = 0; i < reps; ++i) {
    float elapsed = 0.0f;
    check_cuda(cudaEventElapsedTime(&elapsed, start[i].get(), stop[i].get()), "cudaEventElapsedTime");
    ms[i] = elapsed;
  }
  std::sort(ms.begin(), ms.end());
  return reps % 2 == 1 ? ms[reps / 2] : (ms[reps / 2 - 1] + ms[reps / 2]) / 2.0;
}

DeviceTensorView bshd_view(const DeviceMemory& data, const AttentionShape& shape, std::int64_t S, std::int64_t H) {
  return {data.get(), S * H * shape.D, H * shape.D, shape.D};
}

// Rows fwdbwd and bwd, Direct-P on then off, on the forward sets' inputs. Each
// set gets its own dO, O, LSE and kept operands; the workspaces and the
// gradients are shared (stream order keeps the calls apart).
void time_training(const AttentionShape& shape, const BenchOptions& opt, const std::vector<Bf16Inputs>& inputs,
                   cudaStream_t stream, Sm90Benchmark& result) {
  const int sets = static_cast<int>(inputs.size());
  const auto q_bytes = static_cast<std::size_t>(shape.q_elems()) * kBf16Bytes;
  const auto kv_bytes = static_cast<std::size_t>(shape.kv_elems()) * kBf16Bytes;
  struct Set {
    DeviceMemory d_o, o, lse, kept;
  };
  std::vector<Set> per_set;
  for (int i = 0; i < sets; ++i) {
    Set set{cuda_common::device_alloc(q_bytes), cuda_common::device_alloc(q_bytes),
            cuda_common::device_alloc(static_cast<std::size_t>(shape.lse_elems()) * sizeof(float)),
            cuda_common::device_alloc(sm90_device_saved_bytes(shape, Recipe::fp8))};
    cuda_common::fill_normal_bf16(cuda_common::as<std::uint16_t>(set.d_o), shape.q_elems(),
                                  kTensorsPerSet * static_cast<std::uint64_t>(sets + i), stream);
    per_set.push_back(std::move(set));
  }
  const DeviceMemory dq = cuda_common::device_alloc(q_bytes), dk = cuda_common::device_alloc(kv_bytes),
                     dv = cuda_common::device_alloc(kv_bytes);
  const std::size_t fwd_bytes = sm90_device_workspace_bytes(shape, Recipe::fp8);
  const bool deterministic = !sm90_backward_one_pass_faster(shape, opt.mask, opt.window);
  result.deterministic_backward = deterministic;
  // Every backward below is given its set's kept operands.
  const std::size_t bwd_bytes = sm90_device_backward_workspace_bytes(shape, deterministic, Recipe::fp8, true);
  const DeviceMemory fwd_ws = cuda_common::device_alloc(fwd_bytes), bwd_ws = cuda_common::device_alloc(bwd_bytes);
  const std::size_t kept_bytes = sm90_device_saved_bytes(shape, Recipe::fp8);

  // Shape, element type and set i's q, k, v: the fields both entry points' arguments share.
  const auto take_inputs = [&](auto& a, int i) {
    const Bf16Inputs& in = inputs[i % sets];
    a.shape = shape;
    a.element = DeviceElement::bf16;
    a.q = bshd_view(in.q, shape, shape.Sq, shape.Hq);
    a.k = bshd_view(in.k, shape, shape.Sk, shape.Hkv);
    a.v = bshd_view(in.v, shape, shape.Sk, shape.Hkv);
  };
  for (bool direct_p : {true, false}) {
    AttentionOptions attention;
    attention.mask = opt.mask;
    attention.window = opt.window;
    attention.direct_p = direct_p;
    const auto forward = [&](int i) {
      Set& set = per_set[i % sets];
      DeviceForwardArgs a;
      take_inputs(a, i);
      a.o = set.o.get();
      a.o_stride_b = shape.Sq * shape.Hq * shape.D, a.o_stride_s = shape.Hq * shape.D, a.o_stride_h = shape.D;
      a.lse = cuda_common::as<float>(set.lse);
      a.workspace = fwd_ws.get(), a.workspace_bytes = fwd_bytes;
      a.saved = set.kept.get(), a.saved_bytes = kept_bytes;
      sm90_forward_device(a, attention, stream);
    };
    const auto backward = [&](int i) {
      const Set& set = per_set[i % sets];
      DeviceBackwardArgs a;
      take_inputs(a, i);
      a.o = bshd_view(set.o, shape, shape.Sq, shape.Hq);
      a.d_o = bshd_view(set.d_o, shape, shape.Sq, shape.Hq);
      a.lse = cuda_common::as<float>(set.lse);
      a.dq = dq.get(), a.dq_stride_b = a.o.stride_b, a.dq_stride_s = a.o.stride_s, a.dq_stride_h = a.o.stride_h;
      const DeviceTensorView kv = bshd_view(dk, shape, shape.Sk, shape.Hkv);
      a.dk = dk.get(), a.dk_stride_b = kv.stride_b, a.dk_stride_s = kv.stride_s, a.dk_stride_h = kv.stride_h;
      a.dv = dv.get(), a.dv_stride_b = kv.stride_b, a.dv_stride_s = kv.stride_s, a.dv_stride_h = kv.stride_h;
      a.workspace = bwd_ws.get(), a.workspace_bytes = bwd_bytes;
      a.saved = set.kept.get(), a.saved_bytes = kept_bytes;
      sm90_backward_device(a, attention, deterministic, stream);
    };
    result.timings.push_back({TimedOp::fwdbwd, direct_p, median_ms([&](int i) {
                                forward(i);
                                backward(i);
                              },
                              opt.reps, opt.warmup, stream)});
    for (int i = 0; i < sets; ++i) forward(i);  // every set's O, LSE and kept operands for this P path
    result.timings.push_back({TimedOp::bwd, direct_p, median_ms(backward, opt.reps, opt.warmup, stream)});
  }
}

// Op fwd_e4m3 on the quantizer's codes of each input set: Q's and K's (at
// their row pitch, D here) as q and k, K's again as v, one descale per (b, kv
// head). The device entry checks and prepares every call, as a caller's would.
void time_e4m3_inputs(const AttentionShape& shape, const BenchOptions& opt,
                      const std::vector<sm90::fwd::Fp8Operands>& operands, cudaStream_t stream,
                      Sm90Benchmark& result) {
  const std::size_t heads = static_cast<std::size_t>(shape.B * shape.Hkv);
  const std::vector<float> host_descale(heads, 1.0f / 64);
  const DeviceMemory descale = cuda_common::device_alloc(heads * sizeof(float));
  check_cuda(cudaMemcpy(descale.get(), host_descale.data(), heads * sizeof(float), cudaMemcpyHostToDevice),
             "cudaMemcpy");
  const std::size_t ws_bytes = sm90_device_e4m3_workspace_bytes(shape);
  const DeviceMemory workspace = cuda_common::device_alloc(ws_bytes);
  const DeviceMemory o = cuda_common::device_alloc(static_cast<std::size_t>(shape.q_elems()) * kBf16Bytes);
  const DeviceMemory lse = cuda_common::device_alloc(static_cast<std::size_t>(shape.lse_elems()) * sizeof(float));
  const std::int64_t pitch = cuda_quantize::code_pitch_of(operands[0].buffers(), shape.D);
  const auto* d = cuda_common::as<const float>(descale);
  for (bool direct_p : {true, false}) {
    AttentionOptions e4m3;
    e4m3.smooth_k = false;
    e4m3.mask = opt.mask;
    e4m3.window = opt.window;
    e4m3.direct_p = direct_p;
    const auto run = [&](int i) {
      const cuda_quantize::Fp8Buffers& bufs = operands[static_cast<std::size_t>(i) % operands.size()].buffers();
      DeviceE4m3ForwardArgs a;
      a.shape = shape;
      a.q = {bufs.q, shape.Sq * shape.Hq * pitch, shape.Hq * pitch, pitch};
      a.k = {bufs.k, shape.Sk * shape.Hkv * pitch, shape.Hkv * pitch, pitch};
      a.v = a.k;
      a.q_descale = d, a.k_descale = d, a.v_descale = d;
      a.o = o.get();
      a.o_stride_b = shape.Sq * shape.Hq * shape.D, a.o_stride_s = shape.Hq * shape.D, a.o_stride_h = shape.D;
      a.lse = cuda_common::as<float>(lse);
      a.workspace = workspace.get(), a.workspace_bytes = ws_bytes;
      sm90_forward_device_e4m3(a, e4m3, stream);
    };
    result.timings.push_back({TimedOp::fwd_e4m3, direct_p, median_ms(run, opt.reps, opt.warmup, stream)});
  }
}

}  // namespace

Sm90Benchmark sm90_benchmark(const AttentionShape& shape, const BenchOptions& opt) {
  const cudaStream_t stream = nullptr;
  const AttentionOptions defaults;
  const float scale = 1.0f / std::sqrt(static_cast<float>(shape.D));
  int device = 0;
  cudaDeviceProp prop{};
  check_cuda(cudaGetDevice(&device), "cudaGetDevice");
  check_cuda(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties");

  std::vector<sm90::fwd::Fp8Operands> operands;
  operands.emplace_back(shape);
  const int sets = input_sets(operands[0].code_bytes(), static_cast<std::size_t>(prop.l2CacheSize));
  std::vector<Bf16Inputs> inputs;
  for (int i = 0; i < sets; ++i) {
    if (i > 0) operands.emplace_back(shape);
    const auto q_bytes = static_cast<std::size_t>(shape.q_elems()) * kBf16Bytes;
    const auto kv_bytes = static_cast<std::size_t>(shape.kv_elems()) * kBf16Bytes;
    Bf16Inputs in{cuda_common::device_alloc(q_bytes), cuda_common::device_alloc(kv_bytes),
                  cuda_common::device_alloc(kv_bytes)};
    const std::uint64_t seed = kTensorsPerSet * static_cast<std::uint64_t>(i);
    cuda_common::fill_normal_bf16(cuda_common::as<std::uint16_t>(in.q), shape.q_elems(), seed, stream);
    cuda_common::fill_normal_bf16(cuda_common::as<std::uint16_t>(in.k), shape.kv_elems(), seed + 1, stream);
    cuda_common::fill_normal_bf16(cuda_common::as<std::uint16_t>(in.v), shape.kv_elems(), seed + 2, stream);
    inputs.push_back(std::move(in));
  }
  const DeviceMemory o = cuda_common::device_alloc(static_cast<std::size_t>(shape.q_elems()) * kBf16Bytes);
  const DeviceMemory lse = cuda_common::device_alloc(static_cast<std::size_t>(shape.lse_elems()) * sizeof(float));

  const auto quantize = [&](int i) {
    const Bf16Inputs& in = inputs[i % sets];
    cuda_quantize::quantize_fp8(bf16_input(in.q, shape.B, shape.Sq, shape.Hq, shape.D),
                                bf16_input(in.k, shape.B, shape.Sk, shape.Hkv, shape.D),
                                bf16_input(in.v, shape.B, shape.Sk, shape.Hkv, shape.D), defaults.smooth_k, scale,
                                operands[i % sets].buffers(), stream);
  };
  const auto attend = [&](int i, sm90::fwd::PCode p_code) {
    sm90::fwd::Fp8ForwardArgs a = operands[i % sets].forward_args(opt.mask, p_code, scale, defaults.smooth_k);
    a.window_left = kernel_window_bound(opt.window.left), a.window_right = kernel_window_bound(opt.window.right);
    a.o = o.get();
    a.o_stride_b = shape.Sq * shape.Hq * shape.D, a.o_stride_s = shape.Hq * shape.D, a.o_stride_h = shape.D;
    a.lse = cuda_common::as<float>(lse);
    sm90::fwd::forward_fp8(a, stream);
  };
  // Op fwd reads operands quantized here, once; check_finite also surfaces
  // any asynchronous error of the fills and the quantizer.
  for (int i = 0; i < sets; ++i) {
    quantize(i);
    cuda_quantize::check_finite(operands[i].buffers(), stream);
  }

  Sm90Benchmark result;
  result.gpu = prop.name;
  result.input_sets = sets;
  result.rotated_bytes = static_cast<double>(operands[0].code_bytes()) * sets;
  for (TimedOp op : {TimedOp::fwd, TimedOp::fwd_e2e}) {
    for (bool direct_p : {true, false}) {
      const auto p_code = direct_p ? sm90::fwd::PCode::direct_p : sm90::fwd::PCode::exp2_cvt;
      const auto run = [&](int i) {
        if (op == TimedOp::fwd_e2e) quantize(i);
        attend(i, p_code);
      };
      result.timings.push_back({op, direct_p, median_ms(run, opt.reps, opt.warmup, stream)});
    }
  }
  if (shape.D % 16 == 0) time_e4m3_inputs(shape, opt, operands, stream, result);
  if (opt.training) time_training(shape, opt, inputs, stream, result);
  check_cuda(cudaGetLastError(), "sm90 benchmark");
  return result;
}

}  // namespace fp4attn::dispatch

#endif  // FP4ATTN_HAS_CUDA
