// GELU-tanh's derivative, shared by the kernels that take GELU's backward
// (kernels/gelu_backward's pass and fc2's backward product through GELU,
// kernels/gemm_bias_gelu_sm90), so that both compute the same bits:
//   gelu_tanh'(x) = 0.5 (1 + t) + 0.5 x (1 - t^2) k (1 + 3 a x^2),
//   t = tanh(k (x + a x^3)), k = sqrt(2/pi), a = 0.044715,
// in fp32 as ATen computes it; tanh here is 1 - 2 / (exp(2u) + 1) with the
// fast exp and divide (absolute error ~1e-7 in t, far below the bf16
// rounding of a result). Device code only.
#pragma once

namespace perftrain::kernels::gelu_math {

__device__ __forceinline__ float gelu_tanh_grad(float x) {
  constexpr float kBeta = 0.7978845608028654f;  // sqrt(2 / pi)
  constexpr float kKappa = 0.044715f;
  const float x_sq = x * x;
  const float inner = kBeta * (x + kKappa * x_sq * x);
  // tanh(inner); when exp overflows, __fdividef gives 0 and t = 1.
  const float t = 1.f - __fdividef(2.f, __expf(2.f * inner) + 1.f);
  const float left_derivative = 0.5f * (1.f + t);
  const float right_derivative = 0.5f * x * (1.f - t * t) * kBeta * (1.f + 3.f * kKappa * x_sq);
  return left_derivative + right_derivative;
}

}  // namespace perftrain::kernels::gelu_math
