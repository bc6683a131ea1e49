// A standalone check of kernels::gemm_bias_gelu_sm90 and gemm_dgelu_sm90
// without libtorch, for a quick device call: random bf16 inputs, sampled rows
// against a float64 CPU reference, then the time per call at DiT's fc1 shapes (CUDA events over
// windows of back-to-back calls, median window).
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Isrc \
//        tools/gemm_bias_gelu_check.cu src/kernels/gemm_bias_gelu_sm90.cu src/kernels/tensor_map.cpp -o /tmp/gemm_check
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
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
    // FNV-1a over both outputs' bytes: two schedules that agree to the bit print the same digest.
    uint64_t digest = 1469598103934665603ull;
    for (const std::vector<bf16>* out : {&pre, &act}) {
      const auto* bytes = reinterpret_cast<const unsigned char*>(out->data());
      for (size_t i = 0; i < out->size() * sizeof(bf16); ++i) digest = (digest ^ bytes[i]) * 1099511628211ull;
    }
    std::printf("fc1 check m=%lld n=%lld k=%lld: NaN left %lld, worst rel err pre %.3g act %.3g, bad %lld, digest "
                "%016llx -> %s\n",
                (long long)m, (long long)n, (long long)k, (long long)nan, worst_pre, worst_act, (long long)bad,
                (unsigned long long)digest, nan == 0 && bad == 0 ? "PASS" : "FAIL");
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
  return 0;
}

static double gelu_grad(double x) {
  const double k0 = 0.7978845608028654, k1 = 0.044715, t = std::tanh(k0 * (x + k1 * x * x * x));
  return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * k0 * (1 + 3 * k1 * x * x);
}

// The backward's form: dpre = (dy w^T) * gelu'(pre), w [n, k] (fc2's weight transposed).
static int run_dgelu(int64_t m, int64_t n, int64_t k, bool check) {
  std::mt19937 rng(4321);
  std::normal_distribution<float> nd;
  std::vector<bf16> dy(m * k), w(n * k), pre(m * n);
  for (auto& v : dy) v = __float2bfloat16(nd(rng));
  for (auto& v : w) v = __float2bfloat16(nd(rng) / std::sqrt(float(k)));
  for (auto& v : pre) v = __float2bfloat16(1.5f * nd(rng));
  bf16 *d_dy, *d_w, *d_pre, *d_out;
  CHECK(cudaMalloc(&d_dy, dy.size() * 2));
  CHECK(cudaMalloc(&d_w, w.size() * 2));
  CHECK(cudaMalloc(&d_pre, pre.size() * 2));
  CHECK(cudaMalloc(&d_out, m * n * 2));
  CHECK(cudaMemcpy(d_dy, dy.data(), dy.size() * 2, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(d_w, w.data(), w.size() * 2, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(d_pre, pre.data(), pre.size() * 2, cudaMemcpyHostToDevice));
  CHECK(cudaMemset(d_out, 0xff, m * n * 2));
  perftrain::kernels::gemm_dgelu_sm90(d_dy, d_w, d_pre, d_out, m, n, k, nullptr);
  CHECK(cudaDeviceSynchronize());
  if (check) {
    std::vector<bf16> out(m * n);
    CHECK(cudaMemcpy(out.data(), d_out, m * n * 2, cudaMemcpyDeviceToHost));
    int64_t nan = 0, bad = 0;
    double worst = 0;
    for (int64_t i = 0; i < m * n; ++i)
      if (std::isnan(__bfloat162float(out[i]))) ++nan;
    for (int64_t r = 0; r < m; r += std::max<int64_t>(1, m / 97)) {
      for (int64_t c = 0; c < n; ++c) {
        double acc = 0;
        for (int64_t q = 0; q < k; ++q) acc += double(__bfloat162float(dy[r * k + q])) * __bfloat162float(w[c * k + q]);
        const double ref = acc * gelu_grad(__bfloat162float(pre[r * n + c]));
        const double e = std::fabs(__bfloat162float(out[r * n + c]) - ref) / (std::fabs(ref) + 2e-2);
        worst = std::max(worst, e);
        if (e > 1.0 / 32) ++bad;
      }
    }
    std::printf("dgelu check m=%lld n=%lld k=%lld: NaN left %lld, worst rel err %.3g, bad %lld -> %s\n",
                (long long)m, (long long)n, (long long)k, (long long)nan, worst, (long long)bad,
                nan == 0 && bad == 0 ? "PASS" : "FAIL");
  } else if (time_launches("dgelu", m, n, k, [&] {
               perftrain::kernels::gemm_dgelu_sm90(d_dy, d_w, d_pre, d_out, m, n, k, nullptr);
             }) != 0) {
    return 1;
  }
  cudaFree(d_dy);
  cudaFree(d_w);
  cudaFree(d_pre);
  cudaFree(d_out);
  return 0;
}

// With arguments (fc1|dgelu M N K) it only times that shape, e.g. under Nsight Compute.
int main(int argc, char** argv) {
  if (argc != 1) {
    const std::string form = argc == 5 ? argv[1] : "";
    const int64_t m = argc == 5 ? std::atoll(argv[2]) : 0, n = argc == 5 ? std::atoll(argv[3]) : 0,
                  k = argc == 5 ? std::atoll(argv[4]) : 0;
    if ((form != "fc1" && form != "dgelu") || !perftrain::kernels::gemm_bias_gelu_sm90_supported(m, n, k)) {
      std::printf("usage: %s [fc1|dgelu M N K] (M %% 128, N %% 256, K %% 64 == 0)\n", argv[0]);
      return 2;
    }
    return form == "dgelu" ? run_dgelu(m, n, k, false) : run(m, n, k, false);
  }
  int rc = 0;
  rc |= run(256, 512, 384, true);
  rc |= run(1024, 3072, 768, true);
  rc |= run(512, 4608, 1152, true);
  // Many tiles per CTA, and fewer k-steps a tile than ring stages (ping-pong's hand-off between its warpgroups).
  rc |= run(8192, 2048, 768, true);
  rc |= run(4096, 1024, 128, true);
  rc |= run_dgelu(256, 512, 384, true);
  rc |= run_dgelu(1024, 3072, 768, true);
  rc |= run_dgelu(512, 4608, 1152, true);
  rc |= run(65536, 1536, 384, false);
  rc |= run(65536, 3072, 768, false);
  rc |= run(65536, 4608, 1152, false);
  rc |= run_dgelu(65536, 1536, 384, false);
  rc |= run_dgelu(65536, 3072, 768, false);
  rc |= run_dgelu(65536, 4608, 1152, false);
  return rc;
}
