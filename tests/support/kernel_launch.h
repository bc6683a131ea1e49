// What the kernel-level GPU tests of the ops (the "kernels write every output
// element" checks) share: the device guard on CUDA device 0, the stream the
// kernels launch on, and the SM count their tile counts take.
#pragma once

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime.h>

namespace perftrain::testing {

struct KernelLaunch {
  c10::cuda::CUDAGuard guard{c10::Device(c10::DeviceType::CUDA, 0)};
  cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  int sms = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
};

}  // namespace perftrain::testing
