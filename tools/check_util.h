// For the standalone GPU check tools (nvcc, no libtorch): CHECK(call)
// prints a failing CUDA runtime call with its error and returns 1 from the
// function it is in; median_launch_ms times a launch the way all of them do.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <vector>

#define CHECK(x)                                          \
  do {                                                    \
    cudaError_t e = (x);                                  \
    if (e != cudaSuccess) {                               \
      std::printf("%s: %s\n", #x, cudaGetErrorString(e)); \
      return 1;                                           \
    }                                                     \
  } while (0)

// The median milliseconds per call of launch(): 5 warm-up calls, then 7
// windows of 20 calls timed by CUDA events. 0, or 1 on a CUDA error.
template <class Launch>
int median_launch_ms(Launch launch, double* median_ms) {
  cudaEvent_t e0, e1;
  CHECK(cudaEventCreate(&e0));
  CHECK(cudaEventCreate(&e1));
  for (int i = 0; i < 5; ++i) launch();
  std::vector<float> ms;
  for (int window = 0; window < 7; ++window) {
    CHECK(cudaEventRecord(e0));
    for (int i = 0; i < 20; ++i) launch();
    CHECK(cudaEventRecord(e1));
    CHECK(cudaEventSynchronize(e1));
    float t = 0;
    CHECK(cudaEventElapsedTime(&t, e0, e1));
    ms.push_back(t / 20);
  }
  CHECK(cudaGetLastError());
  CHECK(cudaEventDestroy(e0));
  CHECK(cudaEventDestroy(e1));
  std::sort(ms.begin(), ms.end());
  *median_ms = ms[ms.size() / 2];
  return 0;
}
