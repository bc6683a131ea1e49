#include "ops/cuda_timing.h"

#include <ATen/cuda/CUDAEvent.h>

#include <algorithm>
#include <vector>

namespace perftrain::ops {

double median_cuda_ms(const std::function<void()>& run, int warmups, int timed_runs) {
  for (int i = 0; i < warmups; ++i) run();
  std::vector<double> ms;
  for (int i = 0; i < timed_runs; ++i) {
    at::cuda::CUDAEvent start(cudaEventDefault), stop(cudaEventDefault);
    start.record();
    run();
    stop.record();
    stop.synchronize();
    ms.push_back(start.elapsed_time(stop));
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

}  // namespace perftrain::ops
