// What the libtorch programs of bench/kernels share: the time of a call on
// the current CUDA stream (check_util.h is the torch-free programs').
#pragma once

#include <ATen/cuda/CUDAContext.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <vector>

// Milliseconds per call of fn: the median of 9 windows of 10 back-to-back
// calls between two events (so the host's work per call hides behind the
// GPU's), after 10 warm-up calls; NAN when fn returns false (it does not
// apply to the shape).
inline double median_ms(const std::function<bool()>& fn) {
  for (int i = 0; i < 10; ++i)
    if (!fn()) return NAN;
  cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  std::vector<double> ms;
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  for (int win = 0; win < 9; ++win) {
    cudaEventRecord(start, stream);
    for (int i = 0; i < 10; ++i) fn();
    cudaEventRecord(stop, stream);
    cudaEventSynchronize(stop);
    float t = 0;
    cudaEventElapsedTime(&t, start, stop);
    ms.push_back(t / 10);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}
