// Scan of the H200's ex2.approx.ftz.f32 over every float x from -inf to
// ex2::kScanMax (about 3.2e9 inputs): records, as runs of consecutive x with
// one result, every x whose result the emulator's sm90 model must reproduce
// (emulator/ex2_sm90.hpp: ex2::recorded), and compares the hardware with a
// correctly rounded exp2 (double exp2 rounded to float) and with device exp2f.
//
//   ex2_scan OUTDIR   → OUTDIR/ex2_sm90_table.cpp (the generated table),
//                       OUTDIR/ex2_runs.bin (the same runs, raw),
//                       OUTDIR/summary.txt (statistics, also printed)
#include <cuda_runtime.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "emulator/ex2_sm90.hpp"

namespace ex2 = fp4attn::emulator::ex2;

namespace {

#define CHECK_CUDA(expr)                                                                       \
  do {                                                                                         \
    const cudaError_t err_ = (expr);                                                           \
    if (err_ != cudaSuccess) {                                                                 \
      std::fprintf(stderr, "%s: %s\n", #expr, cudaGetErrorString(err_));                       \
      std::exit(1);                                                                            \
    }                                                                                          \
  } while (0)

constexpr std::uint32_t kChunk = 1u << 14;       // keys per thread, scanned in order
constexpr std::uint32_t kMaxRuns = 1u << 22;     // before merging across chunks
constexpr int kUlpBins = 6;                      // |Δ| of 0 .. 4 float steps, then "more"

struct Stats {
  unsigned long long normal_inputs;              // x with a normal hardware result
  unsigned long long hw_vs_cr[kUlpBins];         // ex2.approx vs correctly rounded
  unsigned long long exp2f_vs_hw[kUlpBins];      // device exp2f vs ex2.approx
  unsigned long long exp2f_vs_cr[kUlpBins];      // device exp2f vs correctly rounded
  unsigned long long flushed;                    // hardware result 0 with x > -inf
  unsigned long long flushed_exp2f_nonzero;      // of those, device exp2f gives a subnormal
  unsigned long long recorded;                   // x recorded in the table
  unsigned long long nonmonotone;                // ex2.approx(x) < ex2.approx(previous x)
  unsigned int max_flushed_key;                  // largest x (order key) whose result is 0
  unsigned int runs;
};

__device__ std::uint32_t key_bits(std::uint32_t key) {
  return (key & 0x80000000u) != 0 ? key & 0x7FFFFFFFu : ~key;
}

__device__ int ulp_bin(std::uint32_t a, std::uint32_t b) {
  const std::uint32_t d = a > b ? a - b : b - a;
  return d < kUlpBins - 1 ? static_cast<int>(d) : kUlpBins - 1;
}

__global__ void scan(std::uint32_t key_begin, std::uint32_t key_end, ex2::Run* runs, Stats* stats) {
  const std::uint64_t first = key_begin + static_cast<std::uint64_t>(blockIdx.x * blockDim.x + threadIdx.x) * kChunk;
  if (first > key_end) return;
  const std::uint64_t last = std::min<std::uint64_t>(first + kChunk - 1, key_end);
  unsigned long long normal = 0, flushed = 0, flushed_nz = 0, recorded = 0, nonmono = 0;
  unsigned long long hw_cr[kUlpBins] = {}, f_hw[kUlpBins] = {}, f_cr[kUlpBins] = {};
  unsigned int max_flushed = 0;
  bool open = false;
  ex2::Run run{};
  std::uint32_t prev = 0;
  auto flush = [&] {
    if (!open) return;
    const unsigned int i = atomicAdd(&stats->runs, 1u);
    if (i < kMaxRuns) runs[i] = run;
    open = false;
  };
  for (std::uint64_t k = first; k <= last; ++k) {
    const std::uint32_t key = static_cast<std::uint32_t>(k);
    const std::uint32_t xb = key_bits(key);
    const float x = __uint_as_float(xb);
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    const std::uint32_t yb = __float_as_uint(y);
    if (k > first && yb < prev) ++nonmono;
    prev = yb;
    const float f = exp2f(x);
    if (yb >= ex2::kMinNormalBits) {
      ++normal;
      const std::uint32_t cr = __float_as_uint(__double2float_rn(exp2(static_cast<double>(x))));
      ++hw_cr[ulp_bin(yb, cr)];
      ++f_hw[ulp_bin(__float_as_uint(f), yb)];
      ++f_cr[ulp_bin(__float_as_uint(f), cr)];
    } else if (xb != 0xFF800000u) {
      ++flushed;
      flushed_nz += f != 0.0f;
      max_flushed = max(max_flushed, key);
    }
    if (ex2::recorded(yb)) {
      ++recorded;
      if (open && run.result == yb) {
        run.x_last = xb;
      } else {
        flush();
        run = {xb, xb, yb};
        open = true;
      }
    } else {
      flush();
    }
  }
  flush();
  atomicAdd(&stats->normal_inputs, normal);
  atomicAdd(&stats->flushed, flushed);
  atomicAdd(&stats->flushed_exp2f_nonzero, flushed_nz);
  atomicAdd(&stats->recorded, recorded);
  atomicAdd(&stats->nonmonotone, nonmono);
  atomicMax(&stats->max_flushed_key, max_flushed);
  for (int i = 0; i < kUlpBins; ++i) {
    if (hw_cr[i]) atomicAdd(&stats->hw_vs_cr[i], hw_cr[i]);
    if (f_hw[i]) atomicAdd(&stats->exp2f_vs_hw[i], f_hw[i]);
    if (f_cr[i]) atomicAdd(&stats->exp2f_vs_cr[i], f_cr[i]);
  }
}

std::string bins(const unsigned long long (&b)[kUlpBins]) {
  std::string s;
  for (int i = 0; i < kUlpBins; ++i) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%s%s%d: %llu", i ? ", " : "", i == kUlpBins - 1 ? ">=" : "", i, b[i]);
    s += buf;
  }
  return s;
}

float bits_to_float(std::uint32_t b) { return fp4attn::bits_float(b); }

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: ex2_scan OUTDIR\n");
    return 2;
  }
  const std::string dir = argv[1];
  cudaDeviceProp prop{};
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  int driver = 0;
  CHECK_CUDA(cudaDriverGetVersion(&driver));

  const std::uint32_t key_begin = ex2::order_key(0xFF800000u);  // -inf
  const std::uint32_t key_end = ex2::order_key(fp4attn::float_bits(ex2::kScanMax));
  const std::uint64_t keys = static_cast<std::uint64_t>(key_end) - key_begin + 1;
  const std::uint64_t threads = (keys + kChunk - 1) / kChunk;
  constexpr int kBlock = 256;
  const unsigned int blocks = static_cast<unsigned int>((threads + kBlock - 1) / kBlock);

  ex2::Run* d_runs = nullptr;
  Stats* d_stats = nullptr;
  CHECK_CUDA(cudaMalloc(&d_runs, kMaxRuns * sizeof(ex2::Run)));
  CHECK_CUDA(cudaMalloc(&d_stats, sizeof(Stats)));
  CHECK_CUDA(cudaMemset(d_stats, 0, sizeof(Stats)));
  cudaEvent_t t0, t1;
  CHECK_CUDA(cudaEventCreate(&t0));
  CHECK_CUDA(cudaEventCreate(&t1));
  CHECK_CUDA(cudaEventRecord(t0));
  scan<<<blocks, kBlock>>>(key_begin, key_end, d_runs, d_stats);
  CHECK_CUDA(cudaEventRecord(t1));
  CHECK_CUDA(cudaDeviceSynchronize());
  float ms = 0.0f;
  CHECK_CUDA(cudaEventElapsedTime(&ms, t0, t1));
  Stats st{};
  CHECK_CUDA(cudaMemcpy(&st, d_stats, sizeof st, cudaMemcpyDeviceToHost));
  if (st.runs > kMaxRuns) {
    std::fprintf(stderr, "%u runs, more than the buffer's %u\n", st.runs, kMaxRuns);
    return 1;
  }
  std::vector<ex2::Run> runs(st.runs);
  CHECK_CUDA(cudaMemcpy(runs.data(), d_runs, runs.size() * sizeof(ex2::Run), cudaMemcpyDeviceToHost));

  // Chunks end runs at their edges: sort, then merge neighbours with one result.
  std::sort(runs.begin(), runs.end(),
            [](const ex2::Run& a, const ex2::Run& b) { return ex2::order_key(a.x_first) < ex2::order_key(b.x_first); });
  std::vector<ex2::Run> merged;
  for (const ex2::Run& r : runs) {
    if (!merged.empty() && merged.back().result == r.result &&
        ex2::order_key(merged.back().x_last) + 1 == ex2::order_key(r.x_first))
      merged.back().x_last = r.x_last;
    else
      merged.push_back(r);
  }
  std::uint64_t covered = 0;
  for (const ex2::Run& r : merged) covered += ex2::order_key(r.x_last) - ex2::order_key(r.x_first) + 1;

  char summary[4096];
  std::snprintf(
      summary, sizeof summary,
      "device: %s (sm_%d%d), CUDA driver API %d.%d\n"
      "inputs: every float x from -inf to %.1f: %" PRIu64 " (kernel %.1f ms)\n"
      "normal results: %llu; flushed to 0 (x > -inf): %llu, largest such x = %.9g; device exp2f nonzero there: %llu\n"
      "ex2.approx vs correctly rounded exp2, |difference| in float steps: %s\n"
      "device exp2f vs ex2.approx: %s\n"
      "device exp2f vs correctly rounded: %s\n"
      "ex2.approx decreasing from one float x to the next: %llu times\n"
      "recorded x: %llu (= runs' total %" PRIu64 "); runs: %u per chunk, %zu merged\n",
      prop.name, prop.major, prop.minor, driver / 1000, (driver % 1000) / 10, ex2::kScanMax, keys, ms,
      st.normal_inputs, st.flushed, bits_to_float(~st.max_flushed_key), st.flushed_exp2f_nonzero,
      bins(st.hw_vs_cr).c_str(), bins(st.exp2f_vs_hw).c_str(), bins(st.exp2f_vs_cr).c_str(), st.nonmonotone,
      st.recorded, covered, st.runs, merged.size());
  std::fputs(summary, stdout);
  if (FILE* f = std::fopen((dir + "/summary.txt").c_str(), "w")) {
    std::fputs(summary, f);
    std::fclose(f);
  }

  // The same runs as raw (x_first, x_last, result) words, for table_from_file.cpp.
  if (FILE* b = std::fopen((dir + "/ex2_runs.bin").c_str(), "wb")) {
    std::fwrite(merged.data(), sizeof(ex2::Run), merged.size(), b);
    std::fclose(b);
  }

  FILE* f = std::fopen((dir + "/ex2_sm90_table.cpp").c_str(), "w");
  if (!f) {
    std::perror("table");
    return 1;
  }
  std::fprintf(f,
               "// Generated by dev/ex2_approx (do not edit): the H200's ex2.approx.ftz.f32 at\n"
               "// every float x <= %.1f whose result lies within %u float steps of a P code\n"
               "// decision boundary or is flushed to zero (emulator/ex2_sm90.hpp, ex2::recorded).\n"
               "// Measured on %s, CUDA driver API %d.%d, by\n"
               "//   dev/ex2_approx/build.sh build-ex2 && build-ex2/ex2_scan OUTDIR\n"
               "// then copied from OUTDIR to src/emulator/ (dev/ex2_approx/README.md).\n"
               "// %zu runs (x_first, x_last, result; bits) covering %" PRIu64 " inputs.\n"
               "#include \"emulator/ex2_sm90.hpp\"\n\n"
               "namespace fp4attn::emulator::ex2 {\nnamespace {\n\n"
               "constexpr Run kTable[] = {\n",
               ex2::kScanMax, ex2::kWindowUlps, prop.name, driver / 1000, (driver % 1000) / 10, merged.size(),
               covered);
  for (const ex2::Run& r : merged) std::fprintf(f, "    {0x%08Xu, 0x%08Xu, 0x%08Xu},\n", r.x_first, r.x_last, r.result);
  std::fprintf(f,
               "};\n\n}  // namespace\n\n"
               "std::span<const Run> sm90_table() { return kTable; }\n\n"
               "}  // namespace fp4attn::emulator::ex2\n");
  std::fclose(f);
  return 0;
}
