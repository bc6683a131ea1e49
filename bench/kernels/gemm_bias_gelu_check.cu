// Our fc1 product (kernels::gemm_bias_gelu_sm90) against float64,
// torch-free. Random bf16 inputs (outputs poisoned with NaN first); sampled
// rows of pre = A W^T + bias and act = gelu_tanh(pre) against a float64 CPU
// reference, with a digest of the output bytes (two builds of the kernel
// that agree to the bit print the same digest). Then the time per call at
// DiT's fc1 shapes at b256 (CUDA events over windows of back-to-back calls,
// median window).
//   gemm_bias_gelu_check checks          the float64 checks only: the ctest
//                                        kernels.gemm_bias_gelu_float64 (label
//                                        gpu; exit 77, skipped, without an sm_90 GPU)
//   gemm_bias_gelu_check time            the timings only
//   gemm_bias_gelu_check fc1 M N K       one shape timed (e.g. under Nsight Compute)
//   gemm_bias_gelu_check                 checks, then timings
// Build: cmake --build build --target gemm_bias_gelu_check (binary in
// build/bench/kernels/). On the GPU machine: tools/gpu_run.sh MODE=lab
// LAB=gemm_bias_gelu_check [LAB_ARGS="fc1 65536 3072 768" NCU=1
// NCU_KERNEL=gemm_sm90 NCU_SKIP=3]. bench_gemm_bias_gelu (gemm_bias_gelu_bench.cpp)
// compares the same product with cuBLASLt's.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "check_util.h"
#include "kernels/gemm_bias_gelu_sm90.h"

using bf16 = __nv_bfloat16;

static double gelu(double x) { return 0.5 * x * (1 + std::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x))); }

// Milliseconds per launch: windows of 20 back-to-back launches, so that the
// host's work per launch (two tensor maps) hides behind the GPU's; the
// median of 7 windows after 5 warm-up launches. Prints the TFLOP/s line.
template <typename Launch>
static int time_launches(const char* what, int64_t m, int64_t n, int64_t k, Launch launch) {
  double med = 0;
  if (median_launch_ms(launch, &med) != 0) return 1;
  std::printf("%s time m=%lld n=%lld k=%lld: median %.3f ms, %.0f TFLOP/s\n", what, (long long)m, (long long)n,
              (long long)k, med, 2.0 * m * n * k / med * 1e-9);
  return 0;
}

// With check, 1 when a sampled value misses its reference or NaN is left.
static int run(int64_t m, int64_t n, int64_t k, bool check) {
  std::mt19937 rng(1234);
  std::normal_distribution<float> nd;
  std::vector<bf16> a(m * k), w(n * k);
  std::vector<float> b(n);
  for (auto& v : a) v = __float2bfloat16(nd(rng));
  for (auto& v : w) v = __float2bfloat16(nd(rng) / std::sqrt(float(k)));
  for (auto& v : b) v = 0.5f * nd(rng);
  bf16 *da, *dw, *dpre, *dact;
  float* db;
  CHECK(cudaMalloc(&da, a.size() * 2));
  CHECK(cudaMalloc(&dw, w.size() * 2));
  CHECK(cudaMalloc(&db, b.size() * 4));
  CHECK(cudaMalloc(&dpre, m * n * 2));
  CHECK(cudaMalloc(&dact, m * n * 2));
  CHECK(cudaMemcpy(da, a.data(), a.size() * 2, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(dw, w.data(), w.size() * 2, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(db, b.data(), b.size() * 4, cudaMemcpyHostToDevice));
  CHECK(cudaMemset(dpre, 0xff, m * n * 2));  // NaN in bf16
  CHECK(cudaMemset(dact, 0xff, m * n * 2));
  perftrain::kernels::gemm_bias_gelu_sm90<float>(da, dw, db, dpre, dact, m, n, k, nullptr);
  CHECK(cudaDeviceSynchronize());
  bool ok = true;
  if (check) {
    std::vector<bf16> pre(m * n), act(m * n);
    CHECK(cudaMemcpy(pre.data(), dpre, m * n * 2, cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(act.data(), dact, m * n * 2, cudaMemcpyDeviceToHost));
    double worst_pre = 0, worst_act = 0;
    int64_t bad = 0, nan = 0;
    for (int64_t i = 0; i < m * n; ++i)
      if (std::isnan(__bfloat162float(pre[i])) || std::isnan(__bfloat162float(act[i]))) ++nan;
    for (int64_t r = 0; r < m; r += std::max<int64_t>(1, m / 97)) {
      for (int64_t c = 0; c < n; ++c) {
        double ref = b[c];
        for (int64_t q = 0; q < k; ++q) ref += double(__bfloat162float(a[r * k + q])) * __bfloat162float(w[c * k + q]);
        const double ep = std::fabs(__bfloat162float(pre[r * n + c]) - ref) / (std::fabs(ref) + 1e-2);
        const double ea = std::fabs(__bfloat162float(act[r * n + c]) - gelu(ref)) / (std::fabs(gelu(ref)) + 1e-2);
        worst_pre = std::max(worst_pre, ep);
        worst_act = std::max(worst_act, ea);
        if (ep > 1.0 / 64 || ea > 1.0 / 32) ++bad;
      }
    }
    // FNV-1a over both outputs' bytes.
    uint64_t digest = 1469598103934665603ull;
    for (const std::vector<bf16>* out : {&pre, &act}) {
      const auto* bytes = reinterpret_cast<const unsigned char*>(out->data());
      for (size_t i = 0; i < out->size() * sizeof(bf16); ++i) digest = (digest ^ bytes[i]) * 1099511628211ull;
    }
    std::printf("fc1 check m=%lld n=%lld k=%lld: NaN left %lld, worst rel err pre %.3g act %.3g, bad %lld, digest "
                "%016llx -> %s\n",
                (long long)m, (long long)n, (long long)k, (long long)nan, worst_pre, worst_act, (long long)bad,
                (unsigned long long)digest, nan == 0 && bad == 0 ? "PASS" : "FAIL");
    ok = nan == 0 && bad == 0;
  } else if (time_launches("fc1", m, n, k, [&] {
               perftrain::kernels::gemm_bias_gelu_sm90<float>(da, dw, db, dpre, dact, m, n, k, nullptr);
             }) != 0) {
    return 1;
  }
  cudaFree(da);
  cudaFree(dw);
  cudaFree(db);
  cudaFree(dpre);
  cudaFree(dact);
  return ok ? 0 : 1;
}

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (argc == 5) {
    const int64_t m = std::atoll(argv[2]), n = std::atoll(argv[3]), k = std::atoll(argv[4]);
    if (mode != "fc1" || !perftrain::kernels::gemm_bias_gelu_sm90_supported(m, n, k)) {
      std::printf("usage: %s [checks|time|fc1 M N K] (M %% 128, N %% 256, K %% 64 == 0)\n", argv[0]);
      return 2;
    }
    if (skip_without_sm90("gemm_bias_gelu_check")) return kSkipCode;
    return run(m, n, k, false);
  }
  if (argc > 2 || (mode != "" && mode != "checks" && mode != "time")) {
    std::printf("usage: %s [checks|time|fc1 M N K] (M %% 128, N %% 256, K %% 64 == 0)\n", argv[0]);
    return 2;
  }
  if (skip_without_sm90("gemm_bias_gelu_check")) return kSkipCode;
  int rc = 0;
  if (mode != "time") {
    rc |= run(256, 512, 384, true);
    rc |= run(1024, 3072, 768, true);
    rc |= run(512, 4608, 1152, true);
    // Many tiles per CTA, and fewer k-steps a tile than ring stages (ping-pong's hand-off between its warpgroups).
    rc |= run(8192, 2048, 768, true);
    rc |= run(4096, 1024, 128, true);
  }
  if (mode == "checks") return rc;
  for (const auto& s : {std::array<int64_t, 3>{65536, 1536, 384}, {65536, 3072, 768}, {65536, 4608, 1152}})
    rc |= run(s[0], s[1], s[2], false);  // DiT-S/2, B/2, XL/2 at b256
  return rc;
}
