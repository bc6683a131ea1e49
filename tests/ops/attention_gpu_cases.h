// What the GPU tests of the attention ops share (qkv_attention,
// projected_attention): seeded CUDA generators, N(0, scale^2) fp32 inputs
// on the GPU, and the attention shapes with their names.
#pragma once

#include <ATen/TensorOperators.h>
#include <ATen/cuda/CUDAGeneratorImpl.h>
#include <ATen/ops/randn.h>

#include <cmath>
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

// A packed qkv [B, T, 3D] in bf16 whose every logit is about -127 (q's first
// channel 1, k's first channel -127 sqrt(hd), the rest small; v N(0, 1)):
// softmax ignores the shift, so the gradients must stay finite (cuDNN's
// masked backward turns dq NaN there at T % 128 == 64).
inline at::Tensor very_negative_logits_qkv(const Shape& s, at::Generator& g) {
  const int64_t hd = s.dim / s.heads;
  at::Tensor qkv = rnd({s.batch, s.tokens, 3, s.heads, hd}, g, 0.1);
  qkv.select(2, 0).select(-1, 0).fill_(1.0);
  qkv.select(2, 1).select(-1, 0).fill_(-127.0 * std::sqrt(double(hd)));
  qkv.select(2, 2).normal_(0.0, 1.0, g);
  return qkv.view({s.batch, s.tokens, 3 * s.dim}).to(at::kBFloat16);
}

inline std::string describe(const Shape& s) {
  return "B=" + std::to_string(s.batch) + " T=" + std::to_string(s.tokens) + " D=" + std::to_string(s.dim) +
         " H=" + std::to_string(s.heads);
}

}  // namespace perftrain::ops::attention_gpu_cases
