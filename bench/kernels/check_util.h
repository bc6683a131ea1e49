// For the standalone GPU check tools (nvcc, no libtorch): CHECK(call)
// prints a failing CUDA runtime call with its error and returns 1 from the
// function it is in; median_launch_ms times a launch the way all of them do;
// poison_shared fills every SM's shared memory with NaN before a check.
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

// Fills its shared memory with 0xFF bytes (NaN in bf16 and fp32).
__global__ void poison_shared_memory(int bytes) {
  extern __shared__ unsigned char shared[];
  for (int i = threadIdx.x * 4; i < bytes; i += blockDim.x * 4) *reinterpret_cast<unsigned*>(shared + i) = 0xffffffffu;
}

// Every SM's shared memory poisoned, so that a kernel's read of shared
// memory it did not write shows up as NaN instead of depending on what ran
// on the SM before. 0, or 1 on a CUDA error.
inline int poison_shared() {
  int device = 0, sms = 0, bytes = 0;
  CHECK(cudaGetDevice(&device));
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  CHECK(cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  CHECK(cudaFuncSetAttribute(poison_shared_memory, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
  poison_shared_memory<<<2 * sms, 1024, bytes>>>(bytes);  // one block per SM at a time, every SM twice over
  CHECK(cudaGetLastError());
  return 0;
}
