// Micro-benchmark (GPU, libtorch): the gradient monitor's per-parameter
// statistics and histograms over a real model's parameter list (default
// DiT-XL/2: 675M parameters in ~270 tensors), four ways:
//   fused, hist   ops::grad_stats_into with histograms (kernels/grad_stats.cu:
//                 the monitored step's path)
//   fused, stats  the same without histograms (health.grad_histograms=false)
//   ATen, stats   ops::grad_stat_rows_reference: count_nonzero, isfinite+sum
//                 per parameter, _foreach_norm x3 (the monitor's former path)
//   ATen, hist    ops::grad_histogram_rows_reference: bucketize + scatter_add_
//                 + min/max/sum per parameter
// with the fused pass's read bandwidth (gradient bytes / time). Gradients:
// fp32 like the model's (the monitor reads fp32 gradients), N(0, 1e-4) with
// a few decades of spread. Per call: the median of 7 windows of 3 calls after
// 2 warm-up ones (CUDA events); then a check that the fused rows equal the
// reference's (counts, min, max exactly; the largest relative norm error).
//   grad_stats_bench [model]...   (default: DiT-XL/2 DiT-S/2)
// Build: cmake --build build --target grad_stats_bench (binary in
// build/bench/kernels/). On the GPU machine: MODE=lab LAB=grad_stats_bench
// bash tools/gpu_run.sh.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "compat/compat.h"
#include "models/dit.h"
#include "models/dit_config.h"
#include "ops/grad_stats.h"

namespace {

double median_ms(const std::function<void()>& fn) {
  for (int i = 0; i < 2; ++i) fn();
  cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  std::vector<double> ms;
  for (int w = 0; w < 7; ++w) {
    cudaEventRecord(start, stream);
    for (int i = 0; i < 3; ++i) fn();
    cudaEventRecord(stop, stream);
    cudaEventSynchronize(stop);
    float t = 0;
    cudaEventElapsedTime(&t, start, stop);
    ms.push_back(t / 3);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

at::Tensor monitor_edges(const at::Device& device) {
  std::vector<float> e;
  for (int k = 56; k >= 0; --k) e.push_back(static_cast<float>(-std::pow(10.0, -12.0 + k / 4.0)));
  for (int k = 0; k < 57; ++k) e.push_back(static_cast<float>(std::pow(10.0, -12.0 + k / 4.0)));
  return at::tensor(e, at::kFloat).to(device);
}

void bench(const std::string& name) {
  const at::Device cuda(at::kCUDA, 0);
  const auto cfg = perftrain::models::dit_config(name);
  const auto model = perftrain::models::build_model(cfg, 0, cuda);
  std::vector<at::Tensor> grads;
  int64_t elems = 0;
  for (const auto& [pname, p] : model->named_parameters()) {
    at::Tensor g = at::randn(p.sizes(), p.options().dtype(at::kFloat)) * 1e-4 *
                   at::pow(10.0, at::rand(p.sizes(), p.options().dtype(at::kFloat)) * 4 - 2);
    elems += g.numel();
    grads.push_back(g);
  }
  const auto n = static_cast<int64_t>(grads.size());
  const auto opts = at::TensorOptions().dtype(at::kFloat).device(cuda);
  const at::Tensor edges = monitor_edges(cuda);
  const at::Tensor stats = at::zeros({n, 7}, opts), hist = at::zeros({n, perftrain::ops::kGradHistLead + 115}, opts);
  const double fused_hist = median_ms([&] { perftrain::ops::grad_stats_into(grads, stats, hist, edges); });
  const double fused_stats = median_ms([&] { perftrain::ops::grad_stats_into(grads, stats, {}, {}); });
  const double aten_stats = median_ms([&] { perftrain::ops::grad_stat_rows_reference(grads); });
  const double aten_hist = median_ms([&] { perftrain::ops::grad_histogram_rows_reference(grads, edges); });
  const double gb = static_cast<double>(elems) * 4 / 1e9;
  std::printf("%-9s %4lld tensors %7.1fM elements | fused hist %8.3f ms (%5.0f GB/s)  fused stats %8.3f ms (%5.0f GB/s) | "
              "ATen stats %8.3f ms  ATen hist %8.3f ms  ATen both %8.3f ms | speed-up %.0fx\n",
              name.c_str(), static_cast<long long>(n), elems / 1e6, fused_hist, gb / fused_hist * 1e3, fused_stats,
              gb / fused_stats * 1e3, aten_stats, aten_hist, aten_stats + aten_hist,
              (aten_stats + aten_hist) / fused_hist);

  // The rows themselves.
  perftrain::ops::grad_stats_into(grads, stats, hist, edges);
  const at::Tensor ref_s = perftrain::ops::grad_stat_rows_reference(grads).cpu().to(at::kDouble);
  const at::Tensor ref_h = perftrain::ops::grad_histogram_rows_reference(grads, edges).cpu().to(at::kDouble);
  const at::Tensor s = stats.narrow(1, 0, 5).cpu().to(at::kDouble), h = hist.cpu().to(at::kDouble);
  const int64_t count_diff = (h.narrow(1, 3, 115) != ref_h.narrow(1, 3, 115)).sum().item<int64_t>() +
                             (s.narrow(1, 2, 3) != ref_s.narrow(1, 2, 3)).sum().item<int64_t>() +
                             (h.narrow(1, 0, 2) != ref_h.narrow(1, 0, 2)).sum().item<int64_t>();
  const double norm_err = ((s.narrow(1, 0, 2) - ref_s.narrow(1, 0, 2)).abs() / ref_s.narrow(1, 0, 2).abs().clamp_min(1e-30))
                              .max()
                              .item<double>();
  std::printf("%-9s check: %lld differing counts/min/max/max|g| entries (want 0), largest relative norm/sum|g| error %.2e\n",
              name.c_str(), static_cast<long long>(count_diff), norm_err);
}

}  // namespace

int main(int argc, char** argv) {
  if (!perftrain::compat::cuda_available()) {
    std::printf("grad_stats_bench: no GPU\n");
    return 77;
  }
  std::vector<std::string> names;
  for (int i = 1; i < argc; ++i) names.push_back(argv[i]);
  if (names.empty()) names = {"DiT-XL/2", "DiT-S/2"};
  for (const auto& name : names) bench(name);
  return 0;
}
