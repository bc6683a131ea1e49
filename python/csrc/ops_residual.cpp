// perftrain::gated_residual as a PyTorch operator: forward and backward
// as separate ops (python/perftrain/ops.py joins them with
// torch.library.register_autograd and gives each a fake implementation).
// Forward: ops::gated_residual (the CUDA kernels; the reference on the CPU).
// Backward: ops::detail::gated_residual_backward_cuda on CUDA, autograd
// through the reference on the CPU.
#include <ATen/ops/zeros.h>
#include <ATen/core/grad_mode.h>
#include <torch/library.h>

#include "op_support.h"
#include "ops/gated_residual.h"

namespace perftrain::python {
namespace {

at::Tensor gated_residual(const at::Tensor& x, const at::Tensor& gate, const at::Tensor& y,
                          const std::optional<at::Tensor>& bias) {
  const at::NoGradGuard no_grad;  // autograd is recorded in Python (ops.py)
  return ops::gated_residual(x, gate, y, value_or_undefined(bias));
}

// Returns (dgate, dy, dbias; [0] without a bias). dx is the incoming gradient itself.
std::tuple<at::Tensor, at::Tensor, at::Tensor> gated_residual_backward_cpu(const at::Tensor& grad,
                                                                           const at::Tensor& gate,
                                                                           const at::Tensor& y,
                                                                           const std::optional<at::Tensor>& bias,
                                                                           at::ScalarType x_dtype) {
  // The gradients of gate, y and bias do not depend on x's values.
  const at::Tensor x = at::zeros({1, 1, 1}, y.options().dtype(x_dtype)).expand(y.sizes());
  const Tensors g = grads_through(
      [](const Tensors& in) { return Tensors{ops::gated_residual_reference(in[0], in[1], in[2], in[3])}; },
      {x, gate, y, value_or_undefined(bias)}, {grad});
  return {g[1], g[2], grad_or_slot(g[3], y)};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> gated_residual_backward_cuda(const at::Tensor& grad,
                                                                            const at::Tensor& gate,
                                                                            const at::Tensor& y,
                                                                            const std::optional<at::Tensor>& bias,
                                                                            at::ScalarType x_dtype) {
  const std::optional<at::ScalarType> bias_dtype =
      bias.has_value() ? std::optional<at::ScalarType>(bias->scalar_type()) : std::nullopt;
  const ops::detail::GatedResidualGrads g = ops::detail::gated_residual_backward_cuda(
      grad, gate, y, value_or_undefined(bias), x_dtype, true, true, bias_dtype);
  return {g.gate, g.y, grad_or_slot(g.bias, y)};
}

}  // namespace
}  // namespace perftrain::python

TORCH_LIBRARY_FRAGMENT(perftrain, m) {
  m.def("gated_residual(Tensor x, Tensor gate, Tensor y, Tensor? bias=None) -> Tensor");
  m.def("gated_residual_backward(Tensor grad, Tensor gate, Tensor y, Tensor? bias, ScalarType x_dtype)"
        " -> (Tensor, Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(perftrain, CPU, m) {
  m.impl("gated_residual", &perftrain::python::gated_residual);
  m.impl("gated_residual_backward", &perftrain::python::gated_residual_backward_cpu);
}

TORCH_LIBRARY_IMPL(perftrain, CUDA, m) {
  m.impl("gated_residual", &perftrain::python::gated_residual);
  m.impl("gated_residual_backward", &perftrain::python::gated_residual_backward_cuda);
}
