// Shared by the torch-free programs of bench/kernels: CHECK(call) prints a
// failing CUDA runtime call with its error and returns 1 from the function it
// is in; skip_without_sm90 says whether there is no Hopper GPU to run on (the
// float64 checks then exit with kSkipCode, which ctest counts as skipped);
// median_launch_ms times a launch the way all of them do; poison_shared
// fills every SM's shared memory with NaN before a check.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

// The exit code of a check that could not run here (SKIP_RETURN_CODE in CMake).
constexpr int kSkipCode = 77;

// True, with a line saying why, when there is no CUDA device or device 0 is
// not sm_90 (the kernels under check are built for sm_90a only).
inline bool skip_without_sm90(const char* program) {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count == 0) {
    std::printf("%s: SKIP, no CUDA device (%s)\n", program, e != cudaSuccess ? cudaGetErrorString(e) : "none found");
    return true;
  }
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess || prop.major != 9 || prop.minor != 0) {
    std::printf("%s: SKIP, device 0 is not sm_90 (%s, sm_%d%d)\n", program, prop.name, prop.major, prop.minor);
    return true;
  }
  return false;
}

// The attention checks' main: `program [checks|time]`. The float64 checks
// (check(batch, heads, dim) for each of `shapes` at head dims 64 and 72),
// then, unless "checks", time_shape(batch, heads, dim) at the DiT shapes.
template <class Check, class Time>
int run_attention_checks(int argc, char** argv, const char* program, const int (&shapes)[3][2], Check check,
                         Time time_shape) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (argc > 2 || (mode != "" && mode != "checks" && mode != "time")) {
    std::printf("usage: %s [checks|time]\n", argv[0]);
    return 2;
  }
  if (skip_without_sm90(program)) return kSkipCode;
  int rc = 0;
  if (mode != "time")
    for (const int dim : {64, 72})
      for (const auto& s : shapes) rc |= check(s[0], s[1], dim);
  if (mode == "checks") return rc;
  rc |= time_shape(256, 12, 64);  // DiT-B/2 b256
  rc |= time_shape(256, 6, 64);   // DiT-S/2 b256
  rc |= time_shape(256, 16, 72);  // DiT-XL/2 b256
  return rc;
}

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
