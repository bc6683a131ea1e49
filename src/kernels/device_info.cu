#include "kernels/device_info.h"

#include "kernels/cuda_check.h"

namespace perftrain::kernels {

int multiprocessor_count() {
  int device = 0, count = 0;
  PERFTRAIN_CUDA_CHECK(cudaGetDevice(&device));
  PERFTRAIN_CUDA_CHECK(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device));
  return count;
}

}  // namespace perftrain::kernels
