// The MLP pieces as PyTorch operators: swiglu (SwiGLU's gating on the packed
// gate_up), linear_gelu (fc1 with its bias and GELU in one product) and
// gelu_mlp (the whole MLP, fc2(gelu_tanh(fc1(x))), as the C++ trainer runs it).
// Forward and `<op>_backward` ops, joined in python/perftrain/ops.py.
#include <ATen/core/grad_mode.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/gelu.h>
#include <ATen/ops/gelu_backward.h>
#include <ATen/ops/linear.h>
#include <c10/core/DeviceGuard.h>
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

constexpr const char* kGeluMlp = "gelu_mlp";

// (y, pre, act): y = fc2(gelu_tanh(fc1(x))) [..., D] and the pre-activation
// and activation [..., H] that the backward reads, all in x's dtype. CUDA:
// the C++ op's forward (ops::detail::gelu_mlp_forward_into) on w1 and w2 in x's
// dtype (the given copies, else casts). CPU: fp32 ATen math, rounded once.
std::tuple<at::Tensor, at::Tensor, at::Tensor> gelu_mlp(const at::Tensor& x, const at::Tensor& w1,
                                                        const at::Tensor& b1, const at::Tensor& w2,
                                                        const std::optional<at::Tensor>& b2,
                                                        const std::optional<at::Tensor>& w1_copy,
                                                        const std::optional<at::Tensor>& w2_copy) {
  const at::NoGradGuard no_grad;
  ops::detail::check_gelu_mlp_args(x, w1, b1, w2, value_or_undefined(b2));
  const at::ScalarType dt = x.scalar_type();
  if (!x.is_cuda()) {
    check_weight_copy(kGeluMlp, "w1_copy", w1, w1_copy, dt);
    check_weight_copy(kGeluMlp, "w2_copy", w2, w2_copy, dt);
    const at::Tensor pre = at::linear(x.to(at::kFloat), w1.to(at::kFloat), b1.to(at::kFloat));
    const at::Tensor act = at::gelu(pre, "tanh");
    const at::Tensor y = at::linear(act, w2.to(at::kFloat), b2.has_value() ? b2->to(at::kFloat) : at::Tensor());
    return {y.to(dt), pre.to(dt), act.to(dt)};
  }
  const c10::DeviceGuard device_guard(x.device());
  const int64_t m = ops::detail::leading_rows(x), h = w1.size(0), d = w2.size(0);
  std::vector<int64_t> hidden = x.sizes().vec(), out = x.sizes().vec();
  hidden.back() = h, out.back() = d;
  at::Tensor pre = at::empty(hidden, x.options()), act = at::empty(hidden, x.options());
  at::Tensor y = at::empty(out, x.options());
  ops::detail::gelu_mlp_forward_into(x.contiguous().view({m, x.size(-1)}),
                                     product_weight(kGeluMlp, "w1_copy", w1, w1_copy, dt), b1,
                                     product_weight(kGeluMlp, "w2_copy", w2, w2_copy, dt), value_or_undefined(b2),
                                     pre.view({m, h}), act.view({m, h}), y.view({m, d}));
  return {y, pre, act};
}

// (dx, dw1, db1, dw2, db2) in x's and each parameter's dtype (db2: the empty
// slot without b2). CUDA: the C++ op's backward (ops::detail::gelu_mlp_backward:
// fc2's weight gradient, pre's gradient through GELU in the DGELU epilogue or
// the split form, fc1's, the bias gradients as column sums or from the
// epilogue). CPU: autograd through the fp32 reference.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> gelu_mlp_backward(
    const at::Tensor& grad, const at::Tensor& x, const at::Tensor& w1, const at::Tensor& b1, const at::Tensor& w2,
    const std::optional<at::Tensor>& b2, const std::optional<at::Tensor>& w1_copy,
    const std::optional<at::Tensor>& w2_copy, const at::Tensor& pre, const at::Tensor& act) {
  const at::ScalarType dt = x.scalar_type();
  if (!x.is_cuda()) {
    c10::List<std::optional<at::Tensor>> inputs;
    for (const at::Tensor& t : {x, w1, b1, w2}) inputs.push_back(t);
    inputs.push_back(b2);
    const Tensors g = backward_through(
        [&](const Tensors& in) { return Tensors{ops::gelu_mlp_reference(in[0], in[1], in[2], in[3], in[4]).to(dt)}; },
        {grad}, inputs);
    return {g[0], g[1], g[2], g[3], g[4]};
  }
  const c10::DeviceGuard device_guard(x.device());
  const int64_t m = ops::detail::leading_rows(x), h = w1.size(0);
  const ops::detail::GeluMlpSaved saved{x.contiguous().view({m, x.size(-1)}),
                                        product_weight(kGeluMlp, "w1_copy", w1, w1_copy, dt),
                                        product_weight(kGeluMlp, "w2_copy", w2, w2_copy, dt),
                                        pre.contiguous().view({m, h}), act.contiguous().view({m, h})};
  ops::detail::GeluMlpWanted wanted;
  wanted.x = true, wanted.w1 = w1.scalar_type(), wanted.b1 = b1.scalar_type(), wanted.w2 = w2.scalar_type();
  if (b2.has_value()) wanted.b2 = b2->scalar_type();
  const ops::detail::GeluMlpGrads g = ops::detail::gelu_mlp_backward(grad, saved, x.sizes(), dt, wanted);
  return {g.x, g.w1, g.b1, g.w2, grad_or_slot(g.b2, grad)};
}

}  // namespace
}  // namespace perftrain::python

TORCH_LIBRARY_FRAGMENT(perftrain, m) {
  m.def("swiglu(Tensor gate_up) -> Tensor");
  m.def("swiglu_backward(Tensor grad, Tensor gate_up) -> Tensor");
  m.def("linear_gelu(Tensor x, Tensor weight, Tensor bias) -> (Tensor, Tensor)");
  m.def("linear_gelu_backward(Tensor grad, Tensor x, Tensor weight, Tensor bias, Tensor pre)"
        " -> (Tensor, Tensor, Tensor)");
  m.def("gelu_mlp(Tensor x, Tensor w1, Tensor b1, Tensor w2, Tensor? b2, Tensor? w1_copy, Tensor? w2_copy)"
        " -> (Tensor, Tensor, Tensor)");
  m.def("gelu_mlp_backward(Tensor grad, Tensor x, Tensor w1, Tensor b1, Tensor w2, Tensor? b2, Tensor? w1_copy,"
        " Tensor? w2_copy, Tensor pre, Tensor act) -> (Tensor, Tensor, Tensor, Tensor, Tensor)");
}

// The same kernels for CPU and CUDA (each kernel picks its path by device).
static void register_mlp_kernels(torch::Library& m) {
  m.impl("swiglu", perftrain::python::kernel<&perftrain::python::swiglu>);
  m.impl("swiglu_backward", perftrain::python::kernel<&perftrain::python::swiglu_backward>);
  m.impl("linear_gelu", perftrain::python::kernel<&perftrain::python::linear_gelu>);
  m.impl("linear_gelu_backward", perftrain::python::kernel<&perftrain::python::linear_gelu_backward>);
  m.impl("gelu_mlp", perftrain::python::kernel<&perftrain::python::gelu_mlp>);
  m.impl("gelu_mlp_backward", perftrain::python::kernel<&perftrain::python::gelu_mlp_backward>);
}

TORCH_LIBRARY_IMPL(perftrain, CPU, m) { register_mlp_kernels(m); }

TORCH_LIBRARY_IMPL(perftrain, CUDA, m) { register_mlp_kernels(m); }
