#include "nn/swiglu.h"

#include <ATen/TensorOperators.h>
#include <ATen/ops/silu.h>

namespace perftrain::nn {

SwiGLU::SwiGLU(int64_t dim, int64_t hidden, at::Generator& gen)
    : gate(dim, hidden, gen, false), up(dim, hidden, gen, false), down(hidden, dim, gen, false) {
  register_module("gate", &gate);
  register_module("up", &up);
  register_module("down", &down);
}

at::Tensor SwiGLU::forward(const at::Tensor& x) const {
  return hooked({x}, [this](at::TensorList in) {
    return down.forward(at::silu(gate.forward(in[0])) * up.forward(in[0]));
  });
}

}  // namespace perftrain::nn
