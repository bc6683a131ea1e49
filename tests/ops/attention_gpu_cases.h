// What the GPU tests of the attention ops share (qkv_attention,
// projected_attention): seeded CUDA generators, N(0, scale^2) fp32 inputs
// on the GPU, and the attention shapes with their names.
#pragma once

#include <ATen/TensorOperators.h>
#include <ATen/cuda/CUDAGeneratorImpl.h>
#include <ATen/ops/randn.h>

#include <cstdint>
#include <string>

namespace perftrain::ops::attention_gpu_cases {

inline const at::Device kCuda(at::kCUDA, 0);

inline at::Generator cuda_gen(uint64_t seed) {
  at::Generator g = at::cuda::detail::createCUDAGenerator(0);
  g.set_current_seed(seed);
  return g;
}

inline at::Tensor rnd(at::IntArrayRef shape, at::Generator& g, double scale = 1.0) {
  return at::randn(shape, g, at::TensorOptions().device(kCuda)) * scale;
}

struct Shape {
  int64_t batch, tokens, dim, heads;
};

inline std::string describe(const Shape& s) {
  return "B=" + std::to_string(s.batch) + " T=" + std::to_string(s.tokens) + " D=" + std::to_string(s.dim) +
         " H=" + std::to_string(s.heads);
}

}  // namespace perftrain::ops::attention_gpu_cases
