// The transformer MLP: fc1 -> GELU (tanh approximation) -> fc2, names as in
// timm's Mlp ("fc1", "fc2").
#pragma once

#include "nn/linear.h"

namespace perftrain::nn {

class Mlp : public Module {
 public:
  Mlp(int64_t hidden, int64_t inner, at::Generator& gen);
  at::Tensor forward(const at::Tensor& x) const;

  Linear fc1;
  Linear fc2;
};

}  // namespace perftrain::nn
