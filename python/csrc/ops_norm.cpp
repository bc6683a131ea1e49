// The row norms with adaLN modulation as PyTorch operators: adaln_layernorm
// and rms_adaln (src/ops/), each a forward op and a `<op>_backward` op
// (python/perftrain/ops.py joins them with register_autograd). Forward: the
// C++ op (CUDA kernels; its reference on the CPU). Backward: autograd through
// the C++ op (backward_through: the reference's on the CPU; on CUDA the op's
// own backward kernels, after its forward again).
#include <ATen/core/grad_mode.h>
#include <torch/library.h>

#include "op_support.h"
#include "ops/adaln_layernorm.h"
#include "ops/rms_adaln.h"

namespace perftrain::python {
namespace {

at::Tensor adaln_layernorm(const at::Tensor& x, const at::Tensor& shift, const at::Tensor& scale,
                           at::ScalarType out_dtype, double eps) {
  const at::NoGradGuard no_grad;  // autograd is recorded in Python (ops.py)
  return ops::adaln_layernorm(x, shift, scale, out_dtype, eps);
}

std::vector<at::Tensor> adaln_layernorm_backward(const std::vector<at::Tensor>& grads,
                                                 const c10::List<std::optional<at::Tensor>>& inputs,
                                                 at::ScalarType out_dtype, double eps) {
  return backward_through(
      [&](const Tensors& in) { return Tensors{ops::adaln_layernorm(in[0], in[1], in[2], out_dtype, eps)}; }, grads,
      inputs);
}

at::Tensor rms_adaln(const at::Tensor& x, const std::optional<at::Tensor>& weight,
                     const std::optional<at::Tensor>& scale, at::ScalarType out_dtype, double eps) {
  const at::NoGradGuard no_grad;
  return ops::rms_adaln(x, value_or_undefined(weight), value_or_undefined(scale), out_dtype, eps);
}

std::vector<at::Tensor> rms_adaln_backward(const std::vector<at::Tensor>& grads,
                                           const c10::List<std::optional<at::Tensor>>& inputs,
                                           at::ScalarType out_dtype, double eps) {
  return backward_through(
      [&](const Tensors& in) { return Tensors{ops::rms_adaln(in[0], in[1], in[2], out_dtype, eps)}; }, grads, inputs);
}

}  // namespace
}  // namespace perftrain::python

TORCH_LIBRARY_FRAGMENT(perftrain, m) {
  m.def("adaln_layernorm(Tensor x, Tensor shift, Tensor scale, ScalarType out_dtype, float eps) -> Tensor");
  m.def("adaln_layernorm_backward(Tensor[] grads, Tensor?[] inputs, ScalarType out_dtype, float eps) -> Tensor[]");
  m.def("rms_adaln(Tensor x, Tensor? weight, Tensor? scale, ScalarType out_dtype, float eps) -> Tensor");
  m.def("rms_adaln_backward(Tensor[] grads, Tensor?[] inputs, ScalarType out_dtype, float eps) -> Tensor[]");
}

TORCH_LIBRARY_IMPL(perftrain, CPU, m) {
  m.impl("adaln_layernorm", &perftrain::python::adaln_layernorm);
  m.impl("adaln_layernorm_backward", &perftrain::python::adaln_layernorm_backward);
  m.impl("rms_adaln", &perftrain::python::rms_adaln);
  m.impl("rms_adaln_backward", &perftrain::python::rms_adaln_backward);
}

TORCH_LIBRARY_IMPL(perftrain, CUDA, m) {
  m.impl("adaln_layernorm", &perftrain::python::adaln_layernorm);
  m.impl("adaln_layernorm_backward", &perftrain::python::adaln_layernorm_backward);
  m.impl("rms_adaln", &perftrain::python::rms_adaln);
  m.impl("rms_adaln_backward", &perftrain::python::rms_adaln_backward);
}
