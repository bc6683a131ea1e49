// The MLP pieces as PyTorch operators: swiglu (SwiGLU's gating on the packed
// gate_up) and linear_gelu (fc1 with its bias and GELU in one product).
// Forward and `<op>_backward` ops, joined in python/perftrain/ops.py.
#include <ATen/core/grad_mode.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/gelu.h>
#include <ATen/ops/gelu_backward.h>
#include <ATen/ops/linear.h>
#include <torch/library.h>

#include "base/error.h"
#include "op_support.h"
#include "ops/compute_weights.h"
#include "ops/gelu_mlp.h"
#include "ops/linear.h"
#include "ops/swiglu.h"

namespace perftrain::python {
namespace {

at::Tensor swiglu(const at::Tensor& gate_up) {
  const at::NoGradGuard no_grad;  // autograd is recorded in Python (ops.py)
  return ops::swiglu(gate_up);
}

// CUDA: the op's backward kernel (ops::detail::swiglu_backward_cuda); CPU:
// autograd through the reference.
at::Tensor swiglu_backward(const at::Tensor& grad, const at::Tensor& gate_up) {
  if (gate_up.is_cuda()) return ops::detail::swiglu_backward_cuda(grad, gate_up);
  c10::List<std::optional<at::Tensor>> inputs;
  inputs.push_back(gate_up);
  return backward_through([](const Tensors& in) { return Tensors{ops::swiglu_reference(in[0])}; }, {grad},
                          inputs)[0];
}

constexpr const char* kLinearGelu = "linear_gelu";

// gelu_tanh(x w^T + b) and the pre-activation x w^T + b, both [..., H] in x's
// dtype. CUDA: ops::detail::linear_bias_gelu_into (our Hopper product, else
// cuBLASLt's epilogue, else ATen). CPU: fp32 ATen math, rounded once.
std::tuple<at::Tensor, at::Tensor> linear_gelu(const at::Tensor& x, const at::Tensor& weight,
                                               const at::Tensor& bias) {
  const at::NoGradGuard no_grad;
  if (!bias.defined()) throw UsageError(std::string(kLinearGelu) + ": bias is required");
  ops::detail::check_linear_args(kLinearGelu, x, weight, bias);
  std::vector<int64_t> sizes = x.sizes().vec();
  sizes.back() = weight.size(0);
  if (!x.is_cuda()) {
    const at::Tensor pre = at::linear(x.to(at::kFloat), weight.to(at::kFloat), bias.to(at::kFloat));
    return {at::gelu(pre, "tanh").to(x.scalar_type()), pre.to(x.scalar_type())};
  }
  const int64_t m = ops::detail::leading_rows(x), c = x.size(-1), h = weight.size(0);
  const at::Tensor x2 = x.contiguous().view({m, c});
  at::Tensor pre = at::empty(sizes, x.options()), act = at::empty(sizes, x.options());
  ops::detail::linear_bias_gelu_into(x2, ops::compute_weight(weight, x.scalar_type()), bias.contiguous(),
                                     pre.view({m, h}), act.view({m, h}));
  return {act, pre};
}

// (dx, dweight, dbias) in x's, weight's and bias's dtypes. CUDA: GELU's
// backward on pre (ATen), then the linear layer's backward products
// (ops::detail::linear_input_grad, linear_weight_grad_into). CPU: autograd
// through the fp32 composition.
std::tuple<at::Tensor, at::Tensor, at::Tensor> linear_gelu_backward(const at::Tensor& grad, const at::Tensor& x,
                                                                    const at::Tensor& weight, const at::Tensor& bias,
                                                                    const at::Tensor& pre) {
  if (!x.is_cuda()) {
    c10::List<std::optional<at::Tensor>> inputs;
    for (const at::Tensor& t : {x, weight, bias}) inputs.push_back(t);
    const Tensors g = backward_through(
        [&](const Tensors& in) {
          const at::Tensor p = at::linear(in[0].to(at::kFloat), in[1].to(at::kFloat), in[2].to(at::kFloat));
          return Tensors{at::gelu(p, "tanh").to(x.scalar_type())};
        },
        {grad}, inputs);
    return {g[0], g[1], g[2]};
  }
  const int64_t m = ops::detail::leading_rows(x), c = x.size(-1), h = weight.size(0);
  const at::ScalarType dt = x.scalar_type();
  const at::Tensor pre2 = pre.view({m, h});
  const at::Tensor dpre = at::gelu_backward(grad.to(dt).contiguous().view({m, h}), pre2, "tanh");
  at::Tensor dw = at::empty({h, c}, weight.options()), db = at::empty({h}, bias.options());
  ops::detail::linear_weight_grad_into(dpre, x.contiguous().view({m, c}), dw, db);
  at::Tensor dx = at::empty(x.sizes(), x.options());
  ops::detail::linear_input_grad(dpre, ops::compute_weight(weight, dt), dx.view({m, c}));
  return {dx, dw, db};
}

}  // namespace
}  // namespace perftrain::python

TORCH_LIBRARY_FRAGMENT(perftrain, m) {
  m.def("swiglu(Tensor gate_up) -> Tensor");
  m.def("swiglu_backward(Tensor grad, Tensor gate_up) -> Tensor");
  m.def("linear_gelu(Tensor x, Tensor weight, Tensor bias) -> (Tensor, Tensor)");
  m.def("linear_gelu_backward(Tensor grad, Tensor x, Tensor weight, Tensor bias, Tensor pre)"
        " -> (Tensor, Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(perftrain, CPU, m) {
  m.impl("swiglu", &perftrain::python::swiglu);
  m.impl("swiglu_backward", &perftrain::python::swiglu_backward);
  m.impl("linear_gelu", &perftrain::python::linear_gelu);
  m.impl("linear_gelu_backward", &perftrain::python::linear_gelu_backward);
}

TORCH_LIBRARY_IMPL(perftrain, CUDA, m) {
  m.impl("swiglu", &perftrain::python::swiglu);
  m.impl("swiglu_backward", &perftrain::python::swiglu_backward);
  m.impl("linear_gelu", &perftrain::python::linear_gelu);
  m.impl("linear_gelu_backward", &perftrain::python::linear_gelu_backward);
}
