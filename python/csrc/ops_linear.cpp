// The linear layer as a PyTorch operator: y = x w^T + b, the C++ trainer's
// ops::linear (bias in the product's epilogue; the weight gradient written
// in the weight's dtype straight from the product, the bias gradient as
// column sums). Forward and `linear_backward` ops, joined in
// python/perftrain/ops.py.
#include <ATen/core/grad_mode.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

#include "op_support.h"
#include "ops/linear.h"

namespace perftrain::python {
namespace {

constexpr const char* kLinear = "linear";

// [..., N] in x's dtype. CUDA: the C++ op's forward (ops::detail::
// linear_forward) on the weight in x's dtype (the given copy, else a cast).
// CPU: the fp32 reference, rounded once.
at::Tensor linear(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                  const std::optional<at::Tensor>& weight_copy) {
  const at::NoGradGuard no_grad;
  const at::ScalarType dt = x.scalar_type();
  if (!x.is_cuda()) {
    check_weight_copy(kLinear, "weight_copy", weight, weight_copy, dt);
    return ops::linear(x, weight, value_or_undefined(bias));
  }
  ops::detail::check_linear_args(kLinear, x, weight, value_or_undefined(bias));
  const c10::DeviceGuard device_guard(x.device());
  const at::Tensor x2 = x.contiguous().view({ops::detail::leading_rows(x), x.size(-1)});
  return ops::detail::linear_forward(x2, x.sizes(), product_weight(kLinear, "weight_copy", weight, weight_copy, dt),
                                     value_or_undefined(bias));
}

// (dx, dweight, dbias) in x's, weight's and bias's dtypes (dbias: the empty
// slot without a bias). CUDA: the C++ op's backward (ops::detail::
// linear_backward). CPU: autograd through the fp32 reference.
std::tuple<at::Tensor, at::Tensor, at::Tensor> linear_backward(const at::Tensor& grad, const at::Tensor& x,
                                                               const at::Tensor& weight,
                                                               const std::optional<at::Tensor>& bias,
                                                               const std::optional<at::Tensor>& weight_copy) {
  const at::ScalarType dt = x.scalar_type();
  if (!x.is_cuda()) {
    c10::List<std::optional<at::Tensor>> inputs;
    inputs.push_back(x), inputs.push_back(weight), inputs.push_back(bias);
    const Tensors g = backward_through(
        [&](const Tensors& in) { return Tensors{ops::linear_reference(in[0], in[1], in[2]).to(dt)}; }, {grad},
        inputs);
    return {g[0], g[1], g[2]};
  }
  const c10::DeviceGuard device_guard(x.device());
  const ops::detail::LinearGrads g = ops::detail::linear_backward(
      grad, x.contiguous().view({ops::detail::leading_rows(x), x.size(-1)}),
      product_weight(kLinear, "weight_copy", weight, weight_copy, dt), x.sizes(), dt, /*want_x=*/true,
      weight.scalar_type(), bias.has_value() ? std::optional(bias->scalar_type()) : std::nullopt);
  return {g.x, g.weight, grad_or_slot(g.bias, grad)};
}

}  // namespace
}  // namespace perftrain::python

TORCH_LIBRARY_FRAGMENT(perftrain, m) {
  m.def("linear(Tensor x, Tensor weight, Tensor? bias, Tensor? weight_copy) -> Tensor");
  m.def("linear_backward(Tensor grad, Tensor x, Tensor weight, Tensor? bias, Tensor? weight_copy)"
        " -> (Tensor, Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(perftrain, CPU, m) {
  m.impl("linear", &perftrain::python::linear);
  m.impl("linear_backward", &perftrain::python::linear_backward);
}

TORCH_LIBRARY_IMPL(perftrain, CUDA, m) {
  m.impl("linear", &perftrain::python::linear);
  m.impl("linear_backward", &perftrain::python::linear_backward);
}
