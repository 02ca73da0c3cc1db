// Probe of FP8 wgmma accumulation on sm_90a: runs the sets of probe_inputs.hpp
// through `wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3` (the
// project's wrappers, 128-byte swizzle as the kernel uses) and writes the raw
// fp32 outputs; `check` compares fresh sets with the emulator's model.
//
//   wgmma_probe vectors OUTDIR      every set of kSets → OUTDIR/<set>.bin (float D per trial)
//   wgmma_probe forward OUTDIR      sm90 forward on fixed inputs → OUTDIR/forward.bin
//   wgmma_probe check SEED          fresh sets (seeds shifted by SEED) vs the model; exit 1 on a mismatch
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "cuda/sm90/ptx.cuh"
#include "emulator/tensor_core.hpp"
#include "fp4attn/attention.hpp"
#include "probe_inputs.hpp"

namespace wgmma_probe {
namespace sm90 = fp4attn::sm90;

constexpr int kThreads = 128;       // one warpgroup
constexpr int kSwizzleAtom = 1024;  // 8 rows × 128 B: the 128-byte swizzle pattern
constexpr int kChunk = 16;          // the swizzle permutes 16-byte chunks
constexpr int kSwizzleRows = 8;
constexpr int kARegs = 4;  // A fragment of one k32 step: 4 × 4 codes per thread

#define CUDA_OK(x)                                                                           \
  do {                                                                                       \
    cudaError_t e = (x);                                                                     \
    if (e != cudaSuccess) {                                                                  \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e)); \
      std::exit(2);                                                                          \
    }                                                                                        \
  } while (0)

struct alignas(kSwizzleAtom) Smem {
  std::uint8_t a[kM * kRowBytes];
  std::uint8_t b[kN * kRowBytes];
};

// Row-major (rows × 128 B) into the 128-byte swizzle the descriptor expects:
// chunk c of row r lands at chunk c ^ (r mod 8), as TMA's SWIZZLE_128B writes it.
__device__ void store_swizzled(std::uint8_t* dst, const std::uint8_t* src, int rows) {
  for (int i = threadIdx.x; i < rows * kRowBytes; i += kThreads) {
    const int r = i / kRowBytes, col = i % kRowBytes;
    const int chunk = (col / kChunk) ^ (r % kSwizzleRows);
    dst[r * kRowBytes + chunk * kChunk + col % kChunk] = src[i];
  }
}

// A operand of k32 step `step` from registers: register 2h + r holds the codes
// of row 16·warp + lane/4 + 8r at k = 16h + 4·(lane % 4) + {0..3}, low byte first.
__device__ void load_a_fragment(const std::uint8_t* a, int step, std::uint32_t (&frag)[kARegs]) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int reg = 0; reg < kARegs; ++reg) {
    const int row = 16 * warp + lane / 4 + 8 * (reg & 1);
    const int k = step * kK + 16 * (reg >> 1) + 4 * (lane % 4);
    std::uint32_t w = 0;
    for (int byte = 0; byte < 4; ++byte) w |= static_cast<std::uint32_t>(a[row * kRowBytes + k + byte]) << (8 * byte);
    frag[reg] = w;
  }
}

// Accumulator element 4j + 2r + e of a thread is row 16·warp + lane/4 + 8r, column 8j + 2·(lane%4) + e.
__device__ int fragment_index(int idx) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int j = idx / 4, r = (idx / 2) % 2, e = idx % 2;
  return (16 * warp + lane / 4 + 8 * r) * kN + 8 * j + 2 * (lane % 4) + e;
}

__global__ void __launch_bounds__(kThreads)
    probe_kernel(const std::uint8_t* a_all, const std::uint8_t* b_all, const float* c_all, const int* zero_init,
                 int steps, bool a_from_registers, float* d_all) {
  extern __shared__ std::uint8_t smem_raw[];
  auto& smem = *reinterpret_cast<Smem*>((reinterpret_cast<std::uintptr_t>(smem_raw) + kSwizzleAtom - 1) &
                                        ~std::uintptr_t{kSwizzleAtom - 1});
  const int trial = blockIdx.x;
  const std::uint8_t* a = a_all + static_cast<std::size_t>(trial) * kM * kRowBytes;
  const std::uint8_t* b = b_all + static_cast<std::size_t>(trial) * kN * kRowBytes;
  store_swizzled(smem.a, a, kM);
  store_swizzled(smem.b, b, kN);
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");  // generic-proxy stores → wgmma reads
  __syncthreads();

  float acc[kOutputs / kThreads];
  for (int i = 0; i < kOutputs / kThreads; ++i)
    acc[i] = c_all[static_cast<std::size_t>(trial) * kOutputs + fragment_index(i)];
  const std::uint64_t desc_a = sm90::make_kmajor_desc<sm90::Swizzle::b128>(smem.a);
  const std::uint64_t desc_b = sm90::make_kmajor_desc<sm90::Swizzle::b128>(smem.b);
  const bool init = zero_init[trial] != 0;
  sm90::wgmma_fence();
  for (int t = 0; t < steps; ++t) {
    const std::uint64_t db = desc_b + t * sm90::kDescK32Step;
    if (a_from_registers) {
      std::uint32_t frag[kARegs];
      load_a_fragment(a, t, frag);
      if (t == 0 && init)
        sm90::wgmma_m64n128k32_rs_init(acc, frag, db);
      else
        sm90::wgmma_m64n128k32_rs(acc, frag, db);
    } else {
      const std::uint64_t da = desc_a + t * sm90::kDescK32Step;
      if (t == 0 && init)
        sm90::wgmma_m64n128k32_ss_init(acc, da, db);
      else
        sm90::wgmma_m64n128k32_ss(acc, da, db);
    }
  }
  sm90::wgmma_commit();
  sm90::wgmma_wait<0>();
  sm90::fence_registers(acc);
  for (int i = 0; i < kOutputs / kThreads; ++i)
    d_all[static_cast<std::size_t>(trial) * kOutputs + fragment_index(i)] = acc[i];
}

// Runs one set on the GPU; returns D, (trials, 64, 128).
std::vector<float> run_set(const SetSpec& set, const std::vector<Trial>& trials) {
  const std::size_t n = trials.size();
  std::vector<std::uint8_t> a(n * kM * kRowBytes), b(n * kN * kRowBytes);
  std::vector<float> c(n * kOutputs);
  std::vector<int> zero_init(n);
  for (std::size_t t = 0; t < n; ++t) {
    std::memcpy(&a[t * kM * kRowBytes], trials[t].a.data(), trials[t].a.size());
    std::memcpy(&b[t * kN * kRowBytes], trials[t].b.data(), trials[t].b.size());
    std::memcpy(&c[t * kOutputs], trials[t].c.data(), kOutputs * sizeof(float));
    zero_init[t] = trials[t].zero_init;
  }
  std::uint8_t *da, *db;
  float *dc, *dd;
  int* dz;
  CUDA_OK(cudaMalloc(&da, a.size()));
  CUDA_OK(cudaMalloc(&db, b.size()));
  CUDA_OK(cudaMalloc(&dc, c.size() * sizeof(float)));
  CUDA_OK(cudaMalloc(&dd, c.size() * sizeof(float)));
  CUDA_OK(cudaMalloc(&dz, n * sizeof(int)));
  CUDA_OK(cudaMemcpy(da, a.data(), a.size(), cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(db, b.data(), b.size(), cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(dc, c.data(), c.size() * sizeof(float), cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(dz, zero_init.data(), n * sizeof(int), cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemset(dd, 0xFF, c.size() * sizeof(float)));  // NaN: an unwritten output shows
  const int smem = sizeof(Smem) + kSwizzleAtom;
  CUDA_OK(cudaFuncSetAttribute(probe_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  probe_kernel<<<static_cast<int>(n), kThreads, smem>>>(da, db, dc, dz, set.steps, set.a_from_registers, dd);
  CUDA_OK(cudaGetLastError());
  CUDA_OK(cudaDeviceSynchronize());
  std::vector<float> d(c.size());
  CUDA_OK(cudaMemcpy(d.data(), dd, d.size() * sizeof(float), cudaMemcpyDeviceToHost));
  for (void* p : {static_cast<void*>(da), static_cast<void*>(db), static_cast<void*>(dc), static_cast<void*>(dd),
                  static_cast<void*>(dz)})
    CUDA_OK(cudaFree(p));
  return d;
}

std::vector<Trial> make_trials(const SetSpec& set) {
  std::vector<Trial> trials;
  for (int t = 0; t < set.trials; ++t) trials.push_back(make_trial(set, t));
  return trials;
}

void write_file(const std::string& path, const void* data, std::size_t bytes) {
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr || std::fwrite(data, 1, bytes, f) != bytes) {
    std::fprintf(stderr, "cannot write %s\n", path.c_str());
    std::exit(2);
  }
  std::fclose(f);
}

// The emulator's model on one trial: D for all 64 × 128 outputs.
std::vector<float> model_trial(const Trial& t) {
  std::vector<float> d(kOutputs), b_vals(kK * kN), b_exp(kK * kN), a_vals(kK), a_exp(kK), scratch(2 * kN);
  for (int i = 0; i < kM; ++i) {
    float* acc = &d[i * kN];
    for (int j = 0; j < kN; ++j) acc[j] = t.zero_init ? 0.0f : t.c[i * kN + j];
    for (int s = 0; s < t.steps; ++s) {
      for (int k = 0; k < kK; ++k) {
        a_vals[k] = e4m3_value(t.a[i * kRowBytes + s * kK + k]);
        for (int j = 0; j < kN; ++j) b_vals[k * kN + j] = e4m3_value(t.b[j * kRowBytes + s * kK + k]);
      }
      fp4attn::emulator::e4m3_exponents(a_vals.data(), kK, a_exp.data());
      fp4attn::emulator::e4m3_exponents(b_vals.data(), kK * kN, b_exp.data());
      fp4attn::emulator::fp8_mma_step(a_vals.data(), a_exp.data(), b_vals.data(), b_exp.data(), kN, kK, kN, acc,
                                      scratch.data());
    }
  }
  return d;
}

int check(std::uint64_t seed_shift) {
  long long total = 0, bad = 0;
  for (SetSpec set : kSets) {
    set.seed += seed_shift;
    const std::vector<Trial> trials = make_trials(set);
    const std::vector<float> got = run_set(set, trials);
    long long set_bad = 0;
    for (std::size_t t = 0; t < trials.size(); ++t) {
      const std::vector<float> want = model_trial(trials[t]);
      for (int o = 0; o < kOutputs; ++o) {
        const float g = got[t * kOutputs + o];
        if (std::memcmp(&g, &want[o], sizeof(float)) != 0 && set_bad++ < 5)
          std::printf("  %s trial %zu out %d: gpu %a model %a (family %d, c mode %d)\n", set.name, t, o, g, want[o],
                      trials[t].family, trials[t].c_mode);
      }
    }
    std::printf("check %-10s seed %llu: %lld of %lld outputs differ bitwise\n", set.name,
                static_cast<unsigned long long>(set.seed), set_bad, static_cast<long long>(trials.size()) * kOutputs);
    total += static_cast<long long>(trials.size()) * kOutputs;
    bad += set_bad;
  }
  std::printf("check total: %lld of %lld outputs differ\n", bad, total);
  return bad == 0 ? 0 : 1;
}

// Gaussian values with a per-channel offset, rounded to bf16 (as the GPU tests draw them).
std::vector<float> forward_input(Rng& r, std::int64_t n, std::int64_t D, float offset_scale) {
  std::vector<float> offset(D), x(n);
  for (float& o : offset) o = static_cast<float>(offset_scale * r.normal());
  for (std::int64_t i = 0; i < n; ++i) {
    const float v = static_cast<float>(r.normal()) + offset[i % D];
    const std::uint32_t bits = fp4attn::float_bits(v);
    x[i] = fp4attn::bits_float((bits + 0x7FFFu + ((bits >> 16) & 1u)) & 0xFFFF0000u);
  }
  return x;
}

void forward_dump(const std::string& dir) {
  std::vector<float> blob;  // per case: q, k, v, o, lse
  for (const ForwardCase& fc : kForwardCases) {
    Rng r(0xF0F0 + static_cast<std::uint64_t>(fc.shape.Sk));
    const auto& s = fc.shape;
    const auto q = forward_input(r, s.q_elems(), s.D, 0.5f);
    const auto k = forward_input(r, s.kv_elems(), s.D, 3.0f);
    const auto v = forward_input(r, s.kv_elems(), s.D, 1.0f);
    fp4attn::AttentionOptions opt;
    opt.mask = fc.mask, opt.direct_p = fc.direct_p, opt.smooth_k = fc.smooth_k;
    const fp4attn::ForwardOutput out = fp4attn::forward(s, q, k, v, opt, fp4attn::Executor::sm90);
    for (const auto* part : {&q, &k, &v, &out.o, &out.lse}) blob.insert(blob.end(), part->begin(), part->end());
  }
  write_file(dir + "/forward.bin", blob.data(), blob.size() * sizeof(float));
  std::printf("forward: %zu floats written\n", blob.size());
}

}  // namespace wgmma_probe

int main(int argc, char** argv) {
  using namespace wgmma_probe;
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "vectors" && argc == 3) {
    for (const SetSpec& set : kSets) {
      const std::vector<float> d = run_set(set, make_trials(set));
      write_file(std::string(argv[2]) + "/" + set.name + ".bin", d.data(), d.size() * sizeof(float));
      std::printf("%s: %zu outputs\n", set.name, d.size());
    }
    return 0;
  }
  if (mode == "forward" && argc == 3) {
    forward_dump(argv[2]);
    return 0;
  }
  if (mode == "check" && argc == 3) return check(std::strtoull(argv[2], nullptr, 10));
  std::fprintf(stderr, "usage: wgmma_probe vectors DIR | forward DIR | check SEED\n");
  return 2;
}
