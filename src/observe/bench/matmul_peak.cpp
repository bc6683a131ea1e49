#include "observe/bench/matmul_peak.h"

#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/randn.h>

#include <vector>

#include "base/error.h"
#include "observe/bench/stats.h"
#include "compat/compat.h"

namespace perftrain::observe::bench {

MatmulPeak measure_matmul_peak(const at::Device& device, const MatmulPeakOptions& o) {
  MatmulPeak r;
  if (!device.is_cuda()) {
    r.note = "n/a: no CUDA device";
    return r;
  }
  if (o.n < 1 || o.iterations < 1 || o.input_sets < 1 || o.warmup < 0)
    throw UsageError("matmul peak: n, iterations and input_sets must be positive, warmup non-negative");
  try {
    std::vector<double> rates, times;
    {
      const auto opt = at::TensorOptions().device(device).dtype(at::kBFloat16);
      std::vector<at::Tensor> a, b;
      for (int s = 0; s < o.input_sets; ++s) {
        a.push_back(at::randn({o.n, o.n}, opt));
        b.push_back(at::randn({o.n, o.n}, opt));
      }
      at::Tensor c = at::empty({o.n, o.n}, opt);
      for (int i = 0; i < o.warmup; ++i) at::mm_out(c, a[i % o.input_sets], b[i % o.input_sets]);
      auto stream = at::cuda::getCurrentCUDAStream();
      std::vector<at::cuda::CUDAEvent> start, end;
      start.reserve(o.iterations);
      end.reserve(o.iterations);
      for (int i = 0; i < o.iterations; ++i) {
        start.emplace_back(cudaEventDefault);
        end.emplace_back(cudaEventDefault);
        start.back().record(stream);
        at::mm_out(c, a[i % o.input_sets], b[i % o.input_sets]);
        end.back().record(stream);
      }
      compat::synchronize(device);
      const double flops = 2.0 * static_cast<double>(o.n) * static_cast<double>(o.n) * static_cast<double>(o.n);
      for (int i = 0; i < o.iterations; ++i) {
        const double ms = start[i].elapsed_time(end[i]);
        times.push_back(ms);
        rates.push_back(flops / (ms * 1e-3) / 1e12);
      }
    }
    compat::synchronize(device);
    compat::empty_cuda_cache();  // the operands' blocks go back before the training variants
    const auto t = summarize(times);
    const auto q = summarize(rates);
    r.ms_median = t.median;
    r.tflops = q.median;
    r.tflops_min = q.min;
    r.tflops_max = q.max;
    r.note = "bf16 mm " + std::to_string(o.n) + "^3, median of " + std::to_string(o.iterations) + " after " +
             std::to_string(o.warmup) + " warm-up, " + std::to_string(o.input_sets) + " input sets, CUDA events";
  } catch (const std::exception& e) {
    try {
      compat::empty_cuda_cache();
    } catch (const std::exception&) {
      // The device is in an error state; the note below says why.
    }
    r.tflops.reset();
    r.note = "n/a: " + compat::error_message(e);
  }
  return r;
}

}  // namespace perftrain::observe::bench
