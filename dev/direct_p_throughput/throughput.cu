// Bit identity and issue throughput of FP8 P-code sequences on sm_90a (README.md).
//
//   direct_p_throughput [iterations]
//
// 1. Identity, each GPU instruction against the host model in direct_p.hpp:
//    fp8_codes_x4 (and the candidates that could ship) on scores covering every
//    fixed-point value, every tie of the 2^-11 grid, dense sweeps across every
//    E4M3 rounding boundary, random scores and special values; F2FP's E4M3
//    rounding of every positive finite fp16; VIADD.16x2 + HFMA2 on every x; the
//    decoded-sum helper on random words.
// 2. Throughput: 32 independent scores per thread through one sequence in a
//    loop, one full wave of blocks, clock64 per block: scores/clock/SM.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <random>
#include <vector>

#include "candidates.cuh"

namespace {

using namespace direct_p_study;
using fp4attn::ElemFormat;

#define CHECK_CUDA(call)                                                                      \
  do {                                                                                        \
    const cudaError_t err_ = (call);                                                          \
    if (err_ != cudaSuccess) {                                                                \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(err_)); \
      std::exit(1);                                                                           \
    }                                                                                         \
  } while (0)

constexpr int kThreads = 256;
constexpr int kScores = 32;  // per thread: one row's share of a 128-key tile in the kernel
constexpr int kWords = kScores / 4;
constexpr int kRepeats = 3;
constexpr int kDefaultIterations = 4096;
constexpr float kScoreRange = 24.0f;  // u = s − 24 ∈ [−24, 0]: every code, and the zero tail
constexpr float kMaxDrift = 1.0f / 64;  // m creeps up by this over a run: no iteration repeats another
// The largest x of the precondition u ≤ 1 (u = s·c − m never exceeds m's rounding).
constexpr std::uint32_t kLastX = direct_p::kFp8FixedBias + (1u << direct_p::kFp8FixedFractionBits);

// ---- identity ------------------------------------------------------------------------
template <class Codes>
__global__ void codes_of_scores(const float* __restrict__ u, std::uint32_t* __restrict__ out, int words) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= words) return;
  // c = 1, m = 0: the score FFMA returns u itself.
  out[i] = Codes::run(i, u[4 * i], u[4 * i + 1], u[4 * i + 2], u[4 * i + 3], 1.0f, 0.0f, 0.0f);
}

__global__ void e4m3_of_f16x2(const std::uint32_t* __restrict__ h, std::uint16_t* __restrict__ out, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  std::uint16_t c;
  asm("cvt.rn.satfinite.e4m3x2.f16x2 %0, %1;" : "=h"(c) : "r"(h[i]));
  out[i] = c;
}

__global__ void two_phase_of_x(const std::uint32_t* __restrict__ x, std::uint32_t* __restrict__ out, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = f16x2_two_phase(x[i]);
}

__global__ void decoded_sums(const std::uint32_t* __restrict__ w, float* __restrict__ out, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = direct_p::fp8_decoded_sum_x4(w[i]);
}

template <class T>
T* to_device(const std::vector<T>& h) {
  T* d = nullptr;
  CHECK_CUDA(cudaMalloc(&d, h.size() * sizeof(T)));
  CHECK_CUDA(cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
  return d;
}

template <class T>
std::vector<T> from_device(const T* d, std::size_t n) {
  std::vector<T> h(n);
  CHECK_CUDA(cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost));
  return h;
}

int blocks_for(std::size_t n) { return static_cast<int>((n + kThreads - 1) / kThreads); }

// Scores that exercise every step within the precondition u ≤ 1: each
// fixed-point value, each tie of its grid, ±2 % around every E4M3 boundary,
// random, and special values.
std::vector<float> identity_scores() {
  constexpr double kUnits = 1 << direct_p::kFp8FixedFractionBits;
  constexpr int kRandom = 1 << 22, kSweepSteps = 2000, kSweepUlps = 300;
  std::vector<float> u;
  for (std::uint32_t x = 0; x <= kLastX; ++x) u.push_back(static_cast<float>((x - double{direct_p::kFp8FixedBias}) / kUnits));
  for (int k = -24000; k < 1000; ++k) u.push_back(static_cast<float>((k + 0.5) / kUnits));
  for (std::uint32_t c = 0; c < fp4attn::spec_of(ElemFormat::e4m3).max_code; ++c) {
    const double b = (fp4attn::decode(ElemFormat::e4m3, c) + fp4attn::decode(ElemFormat::e4m3, c + 1)) / 2;
    const double mid = std::log2(b) - direct_p::kFp8Offset;
    if (mid > 0) continue;
    for (int i = 0; i <= kSweepSteps; ++i) u.push_back(static_cast<float>(mid + 0.0286 * (2.0 * i / kSweepSteps - 1)));
    float x = static_cast<float>(mid);
    for (int i = 0; i < kSweepUlps; ++i) x = std::nextafter(x, -1e30f);
    for (int i = 0; i < 2 * kSweepUlps; ++i, x = std::nextafter(x, 1e30f)) u.push_back(x);
  }
  std::mt19937_64 rng(20261130);
  std::uniform_real_distribution<float> score(-40.0f, 1.0f);
  for (int i = 0; i < kRandom; ++i) u.push_back(score(rng));
  const float inf = std::numeric_limits<float>::infinity();
  for (float v : {-inf, -std::numeric_limits<float>::max(), -1e30f, -1e6f, -100.0f, -22.0f, -21.95f, -0.0f, 0.0f,
                  -1e-30f, 1e-30f, 0.5f, 1.0f})
    u.push_back(v);
  while (u.size() % 4) u.push_back(0.0f);
  return u;
}

template <class Codes, class HostCode>
std::size_t check_codes(const char* name, const std::vector<float>& u, HostCode host_code) {
  const int words = static_cast<int>(u.size() / 4);
  float* du = to_device(u);
  std::uint32_t* dout = nullptr;
  CHECK_CUDA(cudaMalloc(&dout, words * sizeof(std::uint32_t)));
  codes_of_scores<Codes><<<blocks_for(words), kThreads>>>(du, dout, words);
  CHECK_CUDA(cudaGetLastError());
  const std::vector<std::uint32_t> got = from_device(dout, words);
  std::size_t bad = 0;
  for (int i = 0; i < words; ++i)
    for (int b = 0; b < 4; ++b) {
      const unsigned g = (got[i] >> (8 * b)) & 0xFFu, want = host_code(u[4 * i + b]);
      if (g != want && ++bad <= 5) std::printf("  %s: u = %.9g GPU %u host %u\n", name, u[4 * i + b], g, want);
    }
  std::printf("identity %-30s %zu scores, %zu mismatches\n", name, u.size(), bad);
  CHECK_CUDA(cudaFree(du));
  CHECK_CUDA(cudaFree(dout));
  return bad;
}

std::size_t check_f2fp_model() {
  constexpr std::uint32_t kLargestFinite = 0x7BFF;
  std::vector<std::uint32_t> h;
  for (std::uint32_t v = 0; v <= kLargestFinite; v += 2) h.push_back(v | ((v + 1) << 16));
  std::uint32_t* dh = to_device(h);
  std::uint16_t* dout = nullptr;
  CHECK_CUDA(cudaMalloc(&dout, h.size() * sizeof(std::uint16_t)));
  e4m3_of_f16x2<<<blocks_for(h.size()), kThreads>>>(dh, dout, static_cast<int>(h.size()));
  CHECK_CUDA(cudaGetLastError());
  const std::vector<std::uint16_t> got = from_device(dout, h.size());
  std::size_t bad = 0;
  for (std::size_t i = 0; i < h.size(); ++i)
    for (int half = 0; half < 2; ++half) {
      const std::uint32_t bits = (h[i] >> (16 * half)) & 0xFFFFu;
      if (bits > kLargestFinite) continue;
      const unsigned g = (got[i] >> (8 * half)) & 0xFFu;
      const unsigned want = fp4attn::encode_rne_sat(ElemFormat::e4m3, direct_p::f16_value(bits));
      if (g != want && ++bad <= 5) std::printf("  f16 %04x: GPU %u host %u\n", bits, g, want);
    }
  std::printf("identity %-30s %u fp16 values, %zu mismatches\n", "F2FP e4m3x2.f16x2", kLargestFinite + 1, bad);
  CHECK_CUDA(cudaFree(dh));
  CHECK_CUDA(cudaFree(dout));
  return bad;
}

std::size_t check_two_phase_model() {
  std::vector<std::uint32_t> x;
  for (std::uint32_t v = 0; v <= kLastX; v += 2) x.push_back(v | ((v + 1) << 16));
  std::uint32_t* dx = to_device(x);
  std::uint32_t* dout = nullptr;
  CHECK_CUDA(cudaMalloc(&dout, x.size() * sizeof(std::uint32_t)));
  two_phase_of_x<<<blocks_for(x.size()), kThreads>>>(dx, dout, static_cast<int>(x.size()));
  CHECK_CUDA(cudaGetLastError());
  const std::vector<std::uint32_t> got = from_device(dout, x.size());
  std::size_t bad = 0;
  for (std::size_t i = 0; i < x.size(); ++i)
    for (int half = 0; half < 2; ++half) {
      const std::uint32_t xi = (x[i] >> (16 * half)) & 0xFFFFu;
      const std::uint32_t g = (got[i] >> (16 * half)) & 0xFFFFu, want = direct_p::fp8_two_phase(xi);
      if (g != want && ++bad <= 5) std::printf("  x %u: GPU %04x host %04x\n", xi, g, want);
    }
  std::printf("identity %-30s %zu x values, %zu mismatches\n", "VIADD.16x2+HFMA2", 2 * x.size(), bad);
  CHECK_CUDA(cudaFree(dx));
  CHECK_CUDA(cudaFree(dout));
  return bad;
}

std::size_t check_decoded_sum() {
  constexpr int kWordsToCheck = 1 << 20;
  std::mt19937 rng(7);
  std::uniform_int_distribution<std::uint32_t> code(0, fp4attn::spec_of(ElemFormat::e4m3).max_code);
  std::vector<std::uint32_t> w(kWordsToCheck);
  for (auto& v : w) v = code(rng) | code(rng) << 8 | code(rng) << 16 | code(rng) << 24;
  std::uint32_t* dw = to_device(w);
  float* dout = nullptr;
  CHECK_CUDA(cudaMalloc(&dout, w.size() * sizeof(float)));
  decoded_sums<<<blocks_for(w.size()), kThreads>>>(dw, dout, kWordsToCheck);
  CHECK_CUDA(cudaGetLastError());
  const std::vector<float> got = from_device(dout, w.size());
  std::size_t bad = 0;
  for (std::size_t i = 0; i < w.size(); ++i)
    if (fp4attn::float_bits(got[i]) != fp4attn::float_bits(direct_p::fp8_decoded_sum_x4(w[i])) && ++bad <= 5)
      std::printf("  word %08x: GPU %.9g host %.9g\n", w[i], got[i], direct_p::fp8_decoded_sum_x4(w[i]));
  std::printf("identity %-30s %d words, %zu mismatches\n", "fp8_decoded_sum_x4", kWordsToCheck, bad);
  CHECK_CUDA(cudaFree(dw));
  CHECK_CUDA(cudaFree(dout));
  return bad;
}

// ---- throughput ----------------------------------------------------------------------
struct RowConstants {
  float c, m, dm;
};

template <class Codes, class Sum>
__global__ void __launch_bounds__(kThreads) throughput(const float* __restrict__ scores, RowConstants rc, int iterations,
                                                       std::uint32_t* __restrict__ codes_out,
                                                       float* __restrict__ sums_out, long long* __restrict__ cycles) {
  const int tid = blockIdx.x * blockDim.x + threadIdx.x, threads = gridDim.x * blockDim.x;
  float s[kScores];
#pragma unroll
  for (int i = 0; i < kScores; ++i) s[i] = scores[i * threads + tid];
  float m = rc.m;
  std::uint32_t folded = 0;
  float l[2] = {0.0f, 0.0f};
  __syncthreads();
  const long long start = clock64();
  for (int it = 0; it < iterations; ++it) {
    m += rc.dm;  // every iteration's scores differ, so nothing is loop-invariant
    const float m8 = m - direct_p::kFp8Offset;
#pragma unroll
    for (int w = 0; w < kWords; ++w) {
      const std::uint32_t word = Codes::run(w, s[4 * w], s[4 * w + 1], s[4 * w + 2], s[4 * w + 3], rc.c, m, m8);
      folded ^= word;
      if constexpr (Sum::kActive) l[w & 1] += Sum::run(word);
    }
  }
  __syncthreads();
  const long long stop = clock64();
  codes_out[tid] = folded;
  sums_out[tid] = l[0] + l[1];
  if (threadIdx.x == 0) cycles[blockIdx.x] = stop - start;
}

struct Bench {
  int sms = 0, iterations = 0;
  const float* scores = nullptr;
  std::uint32_t* codes = nullptr;
  float* sums = nullptr;
  long long* cycles = nullptr;
  double mufu_rate = 0;
};

template <class Codes, class Sum>
double measure(Bench& b) {
  const auto kernel = throughput<Codes, Sum>;
  int per_sm = 0;
  CHECK_CUDA(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, 0));
  const int grid = per_sm * b.sms;
  const RowConstants rc{1.0f, kScoreRange, kMaxDrift / b.iterations};
  std::vector<double> rates;
  double clock_ghz = 0;
  cudaEvent_t t0, t1;
  CHECK_CUDA(cudaEventCreate(&t0));
  CHECK_CUDA(cudaEventCreate(&t1));
  for (int r = 0; r <= kRepeats; ++r) {  // r = 0 warms up
    CHECK_CUDA(cudaEventRecord(t0));
    kernel<<<grid, kThreads>>>(b.scores, rc, b.iterations, b.codes, b.sums, b.cycles);
    CHECK_CUDA(cudaEventRecord(t1));
    CHECK_CUDA(cudaEventSynchronize(t1));
    CHECK_CUDA(cudaGetLastError());
    if (r == 0) continue;
    std::vector<long long> cyc = from_device(b.cycles, grid);
    std::nth_element(cyc.begin(), cyc.begin() + grid / 2, cyc.end());
    const double scores_per_sm = double{kThreads} * per_sm * kScores * b.iterations;
    rates.push_back(scores_per_sm / static_cast<double>(cyc[grid / 2]));
    float ms = 0;
    CHECK_CUDA(cudaEventElapsedTime(&ms, t0, t1));
    clock_ghz = static_cast<double>(cyc[grid / 2]) / (ms * 1e6);
  }
  CHECK_CUDA(cudaEventDestroy(t0));
  CHECK_CUDA(cudaEventDestroy(t1));
  std::sort(rates.begin(), rates.end());
  const double median = rates[rates.size() / 2];
  if (b.mufu_rate == 0) b.mufu_rate = median;
  std::printf("%-34s %-22s %7.2f  [%6.2f, %6.2f]  %5.2fx  %d blocks/SM, clock %.2f GHz\n", Codes::kName, Sum::kName,
              median, rates.front(), rates.back(), median / b.mufu_rate, per_sm, clock_ghz);
  return median;
}

}  // namespace

int main(int argc, char** argv) {
  Bench b;
  b.iterations = argc > 1 ? std::atoi(argv[1]) : kDefaultIterations;
  cudaDeviceProp prop{};
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  b.sms = prop.multiProcessorCount;
  std::printf("%s, %d SMs\n", prop.name, b.sms);

  const std::vector<float> u = identity_scores();
  std::size_t bad = check_codes<TwoPhase>("fp8_codes_x4 (v1)", u, [](float v) { return direct_p::fp8_code(v); });
  bad += check_f2fp_model() + check_two_phase_model() + check_decoded_sum();
  check_codes<TwoPhasePrmt>("v2 candidate", u, [](float v) { return TwoPhasePrmt::host_code(v); });
  check_codes<ThreePhase>("v3 candidate", u, [](float v) { return ThreePhase::host_code(v); });

  // Throughput: the biggest wave the occupancy of any variant needs.
  const std::size_t max_threads = static_cast<std::size_t>(b.sms) * 2048;
  std::vector<float> s(max_threads * kScores);
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> score(0.0f, kScoreRange);
  for (auto& v : s) v = score(rng);
  b.scores = to_device(s);
  CHECK_CUDA(cudaMalloc(&b.codes, max_threads * sizeof(std::uint32_t)));
  CHECK_CUDA(cudaMalloc(&b.sums, max_threads * sizeof(float)));
  CHECK_CUDA(cudaMalloc(&b.cycles, max_threads / kThreads * sizeof(long long)));
  std::printf("\nscores/clk/SM, median of %d runs [min, max], %d iterations x %d scores per thread\n", kRepeats,
              b.iterations, kScores);
  measure<MufuCvt, NoSum>(b);
  measure<OldPoly, NoSum>(b);
  measure<TwoPhase, NoSum>(b);
  measure<TwoPhasePrmt, NoSum>(b);
  measure<ThreePhase, NoSum>(b);
  measure<Split<2>, NoSum>(b);
  measure<Split<4>, NoSum>(b);
  measure<MufuCvt, SumShift>(b);
  measure<MufuCvt, SumCvt>(b);
  measure<OldPoly, SumShift>(b);
  measure<TwoPhase, SumShift>(b);
  measure<TwoPhase, SumCvt>(b);
  measure<TwoPhase, SumF16Pairs>(b);
  std::printf("\nidentity of the shipped sequence: %s (%zu mismatches)\n", bad == 0 ? "PASS" : "FAIL", bad);
  return bad == 0 ? 0 : 1;
}
