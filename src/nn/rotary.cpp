#include "nn/rotary.h"

#include <ATen/TensorOperators.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/stack.h>

#include <cmath>

namespace perftrain::nn {

std::array<int64_t, 3> rope_axes(int64_t head_dim) {
  const int64_t spatial = 2 * ((head_dim * 3) / 16);
  return {head_dim - 2 * spatial, spatial, spatial};
}

std::pair<at::Tensor, at::Tensor> rope_tables(const std::vector<std::array<int64_t, 3>>& positions,
                                              int64_t head_dim, double theta) {
  const auto axes = rope_axes(head_dim);
  const int64_t T = static_cast<int64_t>(positions.size()), half = head_dim / 2;
  at::Tensor cos = at::empty({T, half}, at::kFloat), sin = at::empty({T, half}, at::kFloat);
  float* c = cos.data_ptr<float>();
  float* s = sin.data_ptr<float>();
  for (int64_t i = 0; i < T; ++i) {
    int64_t j = 0;
    for (int axis = 0; axis < 3; ++axis) {
      const int64_t d = axes[axis];
      for (int64_t k = 0; k < d / 2; ++k, ++j) {
        const double a = static_cast<double>(positions[i][axis]) * std::pow(theta, -2.0 * k / d);
        c[i * half + j] = static_cast<float>(std::cos(a));
        s[i * half + j] = static_cast<float>(std::sin(a));
      }
    }
  }
  return {cos, sin};
}

at::Tensor apply_rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  auto sizes = x.sizes().vec();
  sizes.back() /= 2;
  sizes.push_back(2);
  const at::Tensor pairs = x.to(at::kFloat).reshape(sizes);  // [..., T, hd/2, 2]
  const at::Tensor x0 = pairs.select(-1, 0), x1 = pairs.select(-1, 1);
  return at::stack({x0 * cos - x1 * sin, x0 * sin + x1 * cos}, -1).flatten(-2).to(x.scalar_type());
}

}  // namespace perftrain::nn
