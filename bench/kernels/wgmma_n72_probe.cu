// A probe for the head-dim-72 attention kernels, torch-free: what the N = 8
// tail products cost, and whether one m64n72k16 product on an unswizzled
// operand can replace the n64 + n8 pair.
//
// Why: at d = 72 both whole-head kernels are slower per head than d = 64 by
// more than the extra work. Every product with the head dim as N runs as
// m64n64k16 on the 128-byte-swizzled panel plus m64n8k16 on the unswizzled
// tail panel. A single m64n72k16 needs all 72 columns in one layout: without
// swizzle, in 8-column core matrices (TMA boxes of rows x 8 columns, one box
// after the other).
//
// What: one warpgroup per CTA, two CTAs per SM (as the kernels' two
// warpgroups), each accumulating D (64 x N) = A (64 x 256, register
// fragments) B (256 x N, MN-major in shared memory, as V in O = P V or dO in
// dV = P^T dO) over 16 k16 steps, `reps` times:
//   0: n64, swizzled panel (the kernels' main product alone)
//   1: n64 swizzled + n8 tail panel (the kernels' d = 72 product)
//   2: n72 unswizzled, LBO = 4096 (one box to the next, along N), SBO = 128
//   3: n72 unswizzled, LBO = 128, SBO = 4096 (the other reading of the
//      descriptor's two strides for an MN-major operand)
//   4, 5: n64 unswizzled, the same two readings (does the layout cost the
//      n64 part anything?)
// First each variant once against variant 1, which the kernels' float64
// checks cover (the layout reading whose results match is the right one),
// then each timed, in alternation, twice. On the H200 reading 3 is the one
// that matches, and one n72 product takes about 8% less time than n64 + n8.
// Build: cmake --build build --target wgmma_n72_probe (binary in
// build/bench/kernels/). On the GPU machine: tools/gpu_run.sh MODE=lab
// LAB=wgmma_n72_probe.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include "check_util.h"
#include "kernels/attention_sm90.cuh"

namespace {

using namespace perftrain::kernels::attention_sm90;

constexpr int kK = 256, kN = 72, kSteps = kK / 16, kThreads = 128, kVariants = 6;
constexpr uint32_t kMain = 0;                    // [256][64], 128-byte rows, swizzled
constexpr uint32_t kTail = kK * 128;             // [256][8], 16-byte rows
constexpr uint32_t kBoxStride = kK * 16;         // one 8-column box of the unswizzled layout: 4 KB
constexpr uint32_t kPlain = kTail + kK * 16;     // 9 boxes [256][8]
constexpr size_t kSmem = kPlain + 9 * kBoxStride + 1024;

// An unswizzled operand's descriptor with explicit strides (bytes).
__device__ __forceinline__ uint64_t plain_desc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
  return ((addr & 0x3FFFF) >> 4) | (uint64_t(lbo >> 4) << 16) | (uint64_t(sbo >> 4) << 32);
}

// d (64 x 72) = A B (+ d), A from registers, B MN-major.
__device__ __forceinline__ void wgmma_m64n72k16_rs_tb(float (&d)[36], const uint32_t (&a)[4], uint64_t desc_b,
                                                      int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %41, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n72k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, "
      "%23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35}, {%36, %37, %38, %39}, %40, p, 1, 1, 1;\n}\n"
      : PERFTRAIN_SM90_ACC16(0), PERFTRAIN_SM90_ACC16(16), PERFTRAIN_SM90_ACC4(32)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d));
}

template <int V>
__global__ void __launch_bounds__(kThreads) probe_kernel(const uint16_t* __restrict__ b, const uint32_t* __restrict__ a_bits,
                                                        float* __restrict__ out, int reps) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  unsigned char* smem = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);
  const uint32_t base = smem_u32(smem);
  const int tid = threadIdx.x;
  // B [256][72] into the three layouts.
  for (int i = tid; i < kK * kN; i += kThreads) {
    const int k = i / kN, n = i % kN;
    const uint16_t v = b[i];
    if (n < 64)
      *reinterpret_cast<uint16_t*>(smem + kMain + k * 128 + ((((n / 8) ^ (k & 7))) << 4) + (n % 8) * 2) = v;
    else
      *reinterpret_cast<uint16_t*>(smem + kTail + k * 16 + (n - 64) * 2) = v;
    *reinterpret_cast<uint16_t*>(smem + kPlain + (n / 8) * kBoxStride + k * 16 + (n % 8) * 2) = v;
  }
  uint32_t a[kSteps][4];
#pragma unroll
  for (int t = 0; t < kSteps; ++t)
#pragma unroll
    for (int i = 0; i < 4; ++i) a[t][i] = a_bits[(tid * kSteps + t) * 4 + i];
  fence_async_shared();
  __syncthreads();

  // One accumulator per shape, so that no array is reinterpreted (and none
  // leaves the registers); the ones a variant does not use are dropped.
  float d64[32], d8[4], d72[36];
#pragma unroll
  for (int i = 0; i < 4; ++i) d8[i] = 0.f;
  for (int rep = 0; rep < reps; ++rep) {
    wgmma_fence();
    if constexpr (V == 0 || V == 1) {
#pragma unroll
      for (int t = 0; t < kSteps; ++t)
        wgmma_m64n64k16_rs_tb(d64, a[t], smem_desc_mn(base + kMain + 16 * t * 128), rep > 0 || t > 0);
      if constexpr (V == 1)
#pragma unroll
        for (int t = 0; t < kSteps; ++t)
          wgmma_m64n8k16_rs_tb(d8, a[t], smem_desc_tail(base + kTail + 16 * t * 16), rep > 0 || t > 0);
    } else if constexpr (V == 2 || V == 3) {
      constexpr uint32_t lbo = V == 2 ? kBoxStride : 128, sbo = V == 2 ? 128 : kBoxStride;
#pragma unroll
      for (int t = 0; t < kSteps; ++t)
        wgmma_m64n72k16_rs_tb(d72, a[t], plain_desc(base + kPlain + 16 * t * 16, lbo, sbo), rep > 0 || t > 0);
    } else {
      constexpr uint32_t lbo = V == 4 ? kBoxStride : 128, sbo = V == 4 ? 128 : kBoxStride;
#pragma unroll
      for (int t = 0; t < kSteps; ++t)
        wgmma_m64n64k16_rs_tb(d64, a[t], plain_desc(base + kPlain + 16 * t * 16, lbo, sbo), rep > 0 || t > 0);
    }
    wgmma_commit();
    wgmma_wait<0>();
    if constexpr (V == 2 || V == 3) {
      fence_accumulators(d72);
    } else {
      fence_accumulators(d64);
      fence_accumulators(d8);
    }
  }
  float* o = out + (size_t(blockIdx.x) * kThreads + tid) * 36;
  if constexpr (V == 2 || V == 3) {
#pragma unroll
    for (int i = 0; i < 36; ++i) o[i] = d72[i];
  } else {
#pragma unroll
    for (int i = 0; i < 32; ++i) o[i] = d64[i];
    if constexpr (V == 1)
#pragma unroll
      for (int i = 0; i < 4; ++i) o[32 + i] = d8[i];
  }
#else
  __trap();
#endif
}

using Kernel = void (*)(const uint16_t*, const uint32_t*, float*, int);
const Kernel kKernels[kVariants] = {probe_kernel<0>, probe_kernel<1>, probe_kernel<2>,
                                    probe_kernel<3>, probe_kernel<4>, probe_kernel<5>};
const char* kNames[kVariants] = {"n64 swizzled", "n64 swizzled + n8 tail", "n72 plain (LBO 4096, SBO 128)",
                                 "n72 plain (LBO 128, SBO 4096)", "n64 plain (LBO 4096, SBO 128)",
                                 "n64 plain (LBO 128, SBO 4096)"};

uint16_t bf16_bits(float f) {  // round to nearest even
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return uint16_t((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

}  // namespace

int main() {
  int device = 0, sms = 0;
  CHECK(cudaGetDevice(&device));
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  const int grid = 2 * sms;
  uint64_t state = 0x9E3779B97F4A7C15ull;
  auto uniform = [&] {  // [-1, 1)
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return float((state >> 40) & 0xFFFFFF) / float(1 << 23) - 1.f;
  };
  std::vector<uint16_t> b(kK * kN);
  for (auto& v : b) v = bf16_bits(uniform());
  std::vector<uint32_t> a_bits(kThreads * kSteps * 4);
  for (auto& v : a_bits) v = uint32_t(bf16_bits(uniform())) | (uint32_t(bf16_bits(uniform())) << 16);

  uint16_t* d_b = nullptr;
  uint32_t* d_a = nullptr;
  float* d_out[kVariants] = {};
  const size_t out_floats = size_t(grid) * kThreads * 36;
  CHECK(cudaMalloc(&d_b, b.size() * 2));
  CHECK(cudaMalloc(&d_a, a_bits.size() * 4));
  CHECK(cudaMemcpy(d_b, b.data(), b.size() * 2, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(d_a, a_bits.data(), a_bits.size() * 4, cudaMemcpyHostToDevice));
  for (int v = 0; v < kVariants; ++v) {
    CHECK(cudaMalloc(&d_out[v], out_floats * 4));
    CHECK(cudaMemset(d_out[v], 0xFF, out_floats * 4));  // NaN: what a variant does not write shows
    CHECK(cudaFuncSetAttribute(kKernels[v], cudaFuncAttributeMaxDynamicSharedMemorySize, int(kSmem)));
  }

  // Once each (reps = 1), against variant 1: columns 0-63 (and 64-71 for n72).
  std::vector<std::vector<float>> got(kVariants, std::vector<float>(out_floats));
  for (int v = 0; v < kVariants; ++v) {
    kKernels[v]<<<grid, kThreads, kSmem>>>(d_b, d_a, d_out[v], 1);
    CHECK(cudaGetLastError());
    CHECK(cudaDeviceSynchronize());
    CHECK(cudaMemcpy(got[v].data(), d_out[v], out_floats * 4, cudaMemcpyDeviceToHost));
  }
  bool plain_ok[kVariants] = {};
  for (int v = 0; v < kVariants; ++v) {
    if (v == 1) continue;
    const int n_cmp = v == 2 || v == 3 ? 36 : 32;
    double worst = 0;
    size_t differ = 0;
    for (size_t i = 0; i < out_floats; ++i) {
      if (int(i % 36) >= n_cmp) continue;
      const double x = got[v][i], y = got[1][i];
      const double e = std::isfinite(x) ? std::fabs(x - y) / (1.0 + std::fabs(y)) : INFINITY;
      worst = std::max(worst, e);
      differ += x != y;
    }
    plain_ok[v] = worst < 1e-5;
    std::printf("wgmma n72 probe check: %-32s against n64 + n8: worst rel error %.3g, %zu of %zu values not bitwise equal -> %s\n",
                kNames[v], worst, differ, out_floats / 36 * n_cmp, plain_ok[v] ? "MATCH" : "DIFFERENT");
  }

  // Timing: reps = 64 per launch, variants in alternation, two rounds.
  const int reps = 64;
  for (int round = 0; round < 2; ++round)
    for (int v = 0; v < kVariants; ++v) {
      if ((v >= 2) && !plain_ok[v]) continue;  // a wrong reading of the strides is not worth timing
      double ms = 0;
      if (median_launch_ms([&] { kKernels[v]<<<grid, kThreads, kSmem>>>(d_b, d_a, d_out[v], reps); }, &ms) != 0) return 1;
      const int n_useful = v == 0 || v >= 4 ? 64 : 72;
      const double flops = 2.0 * 64 * n_useful * kK * double(reps) * grid;
      std::printf("wgmma n72 probe time [round %d] %-32s: %.4f ms, %.0f TFLOP/s (N = %d counted)\n", round, kNames[v],
                  ms, flops / ms * 1e-9, n_useful);
    }
  for (int v = 0; v < kVariants; ++v) CHECK(cudaFree(d_out[v]));
  CHECK(cudaFree(d_b));
  CHECK(cudaFree(d_a));
  return 0;
}
