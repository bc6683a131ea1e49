// Error checking for the CUDA runtime and cuBLASLt calls of the kernels
// layer: a failed call throws std::runtime_error naming the call, the file
// and the line, so the op layer above can turn it into a clear message.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

namespace perftrain::kernels {

inline void cuda_check(cudaError_t status, const char* what, const char* file, int line) {
  if (status != cudaSuccess)
    throw std::runtime_error(std::string(what) + " failed: " + cudaGetErrorString(status) + " (" + file + ":" +
                             std::to_string(line) + ")");
}

inline void cublas_check(cublasStatus_t status, const char* what, const char* file, int line) {
  if (status != CUBLAS_STATUS_SUCCESS)
    throw std::runtime_error(std::string(what) + " failed: cuBLAS status " + std::to_string(int(status)) + " (" +
                             file + ":" + std::to_string(line) + ")");
}

}  // namespace perftrain::kernels

#define PERFTRAIN_CUDA_CHECK(call) ::perftrain::kernels::cuda_check((call), #call, __FILE__, __LINE__)
#define PERFTRAIN_CUBLAS_CHECK(call) ::perftrain::kernels::cublas_check((call), #call, __FILE__, __LINE__)
// After a kernel launch: a bad configuration shows up here, not at the next sync.
#define PERFTRAIN_LAUNCH_CHECK() PERFTRAIN_CUDA_CHECK(cudaGetLastError())
