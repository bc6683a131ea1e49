// Micro-benchmark (GPU, libtorch): fc1 with bias and GELU through our own
// Hopper product (ops::try_gemm_bias_gelu_sm90) against cuBLASLt's
// GELU_AUX_BIAS product (the fallback where ours cannot run) and its plain
// BIAS product (the same FLOPs, one output, no GELU), on DiT's fc1 shapes at
// batch 256, side by side in one process: per call, the median of 9 windows
// of 10 back-to-back calls after 10 warm-up ones (cuBLASLt's first call also
// times its candidate algorithms), CUDA events, fresh random inputs. Also the
// largest difference between our pre/act and cuBLASLt's (theirs take a bf16
// bias, ours the fp32 one).
//   bench_gemm_bias_gelu [m n k]...     (default: DiT-S/2, B/2, XL/2 at b256)
// Build: cmake --build build --target bench_gemm_bias_gelu (binary in
// build/bench/kernels/). On the GPU machine: tools/gpu_run.sh MODE=lab
// LAB=bench_gemm_bias_gelu [LAB_ARGS="65536 3072 768"].
#include <ATen/TensorOperators.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/randn.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "kernels/gemm_lt.h"
#include "ops/cublaslt_workspace.h"
#include "ops/gemm_bias_gelu.h"

#include "torch_timing.h"

namespace {

using perftrain::kernels::GemmEpilogue;

// "ms (TFLOP/s)" for a table cell.
std::string ms_and_tflops(double ms, double flop) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.3f (%.0f)", ms, flop / ms * 1e-9);
  return buf;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::vector<int64_t>> shapes = {{65536, 1536, 384}, {65536, 3072, 768}, {65536, 4608, 1152}};
  if (argc > 1) {
    shapes.clear();
    for (int i = 1; i + 2 < argc; i += 3)
      shapes.push_back({std::atoll(argv[i]), std::atoll(argv[i + 1]), std::atoll(argv[i + 2])});
  }
  const c10::cuda::CUDAGuard guard(0);
  const auto opts = at::TensorOptions().device(at::kCUDA);
  std::printf("| m | n | k | ours ms (TFLOP/s) | cuBLASLt GELU_AUX_BIAS ms (TFLOP/s) | cuBLASLt BIAS ms (TFLOP/s) | "
              "max |pre diff| | max |act diff| |\n|---|---|---|---|---|---|---|---|\n");
  for (const auto& s : shapes) {
    const int64_t m = s[0], n = s[1], k = s[2];
    const at::Tensor a = at::randn({m, k}, opts).to(at::kBFloat16);
    const at::Tensor w = (at::randn({n, k}, opts) / std::sqrt(double(k))).to(at::kBFloat16);
    const at::Tensor b = at::randn({n}, opts) * 0.5, b16 = b.to(at::kBFloat16);
    const auto bf = opts.dtype(at::kBFloat16);
    const at::Tensor pre = at::empty({m, n}, bf), act = at::empty({m, n}, bf);
    const at::Tensor pre_lt = at::empty({m, n}, bf), act_lt = at::empty({m, n}, bf);
    const double ours = median_ms([&] { return perftrain::ops::try_gemm_bias_gelu_sm90(a, w, b, pre, act); });
    const double lt_gelu = median_ms([&] {
      return perftrain::ops::try_gemm_lt(a, false, w, true, act_lt, GemmEpilogue::kGeluAuxBias, b16, pre_lt);
    });
    const at::Tensor plain = at::empty({m, n}, bf);
    const double lt_bias =
        median_ms([&] { return perftrain::ops::try_gemm_lt(a, false, w, true, plain, GemmEpilogue::kBias, b16); });
    const auto cell = [flop = 2.0 * m * n * k](double ms) { return ms_and_tflops(ms, flop); };
    const double dpre = (pre.to(at::kFloat) - pre_lt.to(at::kFloat)).abs().max().item<double>();
    const double dact = (act.to(at::kFloat) - act_lt.to(at::kFloat)).abs().max().item<double>();
    std::printf("| %lld | %lld | %lld | %s | %s | %s | %.3g | %.3g |\n", (long long)m, (long long)n, (long long)k,
                cell(ours).c_str(), cell(lt_gelu).c_str(), cell(lt_bias).c_str(), dpre, dact);
  }
  return 0;
}
