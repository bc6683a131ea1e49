// SwiGLU feed-forward without biases: down(silu(gate(x)) * up(x)).
#pragma once

#include "nn/linear.h"

namespace perftrain::nn {

class SwiGLU : public Module {
 public:
  SwiGLU(int64_t dim, int64_t hidden, at::Generator& gen);
  at::Tensor forward(const at::Tensor& x) const;

  Linear gate, up, down;  // [hidden, dim], [hidden, dim], [dim, hidden]
};

}  // namespace perftrain::nn
