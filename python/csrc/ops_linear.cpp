// The linear layer as a PyTorch operator: y = x w^T + b, the C++ trainer's
// ops::linear (bias in the product's epilogue; the weight gradient written
// in the weight's dtype straight from the product, the bias gradient as
// column sums), and stacked_linear, several such layers reading one input as
// one product (ops::stacked_linear: DiT's adaLN modulations). Forward and
// `<op>_backward` ops, joined in python/perftrain/ops.py.
#include <ATen/core/grad_mode.h>
#include <ATen/ops/cat.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

#include <string>

#include "base/error.h"
#include "op_support.h"
#include "ops/linear.h"
#include "ops/stacked_linear.h"

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

constexpr const char* kStacked = "stacked_linear";

// UsageError unless copies is empty or one copy of each part in dtype.
void check_copies(const std::vector<at::Tensor>& parts, const std::vector<at::Tensor>& copies, at::ScalarType dtype,
                  const char* what) {
  if (copies.empty()) return;
  if (copies.size() != parts.size())
    throw UsageError(std::string(kStacked) + ": " + what + " has " + std::to_string(copies.size()) +
                     " tensors for " + std::to_string(parts.size()) + " (none, or one per layer)");
  for (size_t i = 0; i < parts.size(); ++i) check_weight_copy(kStacked, what, parts[i], copies[i], dtype);
}

// parts (weights or biases) as the product reads them in dtype, stacked: the
// copies where given (checked by check_copies; back to back in memory, as
// DeviceAdamW lays out copies of one shape, they are read in place), else
// the parts cast.
at::Tensor stacked_in(const std::vector<at::Tensor>& parts, const std::vector<at::Tensor>& copies,
                      at::ScalarType dtype) {
  return copies.empty() ? ops::detail::stacked_weights_in(parts, dtype) : ops::detail::stacked_rows(copies);
}

// [..., sum N_i] in x's dtype. CUDA: the C++ op's forward; CPU: the fp32
// reference, rounded once. weight_copies / bias_copies: empty, or one copy
// in x's dtype per weight / bias (DeviceAdamW's).
at::Tensor stacked_linear(const at::Tensor& x, const std::vector<at::Tensor>& weights,
                          const std::vector<at::Tensor>& biases, const std::vector<at::Tensor>& weight_copies,
                          const std::vector<at::Tensor>& bias_copies) {
  const at::NoGradGuard no_grad;
  ops::detail::check_stacked_linear_args(x, weights, biases);
  const at::ScalarType dt = x.scalar_type();
  check_copies(weights, weight_copies, dt, "weight_copies");
  check_copies(biases, bias_copies, dt, "bias_copies");
  if (!x.is_cuda()) return ops::stacked_linear_reference(x, weights, biases).to(dt);  // the copies unread
  const at::Tensor w = stacked_in(weights, weight_copies, dt);
  const at::Tensor b = biases.empty() ? at::Tensor() : stacked_in(biases, bias_copies, dt);
  return ops::detail::stacked_linear_forward(x, w, b);
}

// (dx, dweight, dbias): dweight [sum N_i, K] in the weights' dtype and dbias
// [sum N_i] in the biases' (the empty slot without biases), stacked: ops.py
// hands each layer its row block. CUDA: the C++ op's backward; CPU: autograd
// through the fp32 reference.
std::tuple<at::Tensor, at::Tensor, at::Tensor> stacked_linear_backward(const at::Tensor& grad, const at::Tensor& x,
                                                                       const std::vector<at::Tensor>& weights,
                                                                       const std::vector<at::Tensor>& biases,
                                                                       const std::vector<at::Tensor>& weight_copies) {
  const at::ScalarType dt = x.scalar_type();
  const int64_t k = x.size(-1);
  if (!x.is_cuda()) {
    c10::List<std::optional<at::Tensor>> inputs;
    inputs.push_back(x);
    for (const auto& w : weights) inputs.push_back(w);
    for (const auto& b : biases) inputs.push_back(b);
    const size_t n = weights.size();
    const Tensors g = backward_through(
        [&](const Tensors& in) {
          const Tensors w(in.begin() + 1, in.begin() + 1 + n), b(in.begin() + 1 + n, in.end());
          return Tensors{ops::stacked_linear_reference(in[0], w, b).to(dt)};
        },
        {grad}, inputs);
    const Tensors dw(g.begin() + 1, g.begin() + 1 + n), db(g.begin() + 1 + n, g.end());
    return {g[0], at::cat(dw, 0), db.empty() ? no_grad_slot(grad) : at::cat(db, 0)};
  }
  const c10::DeviceGuard device_guard(x.device());
  check_copies(weights, weight_copies, dt, "weight_copies");
  const at::Tensor w = stacked_in(weights, weight_copies, dt);
  const ops::detail::StackedLinearGrads g = ops::detail::stacked_linear_backward(
      grad, x.contiguous().view({x.numel() / k, k}), w, x.sizes(), dt, /*want_x=*/true,
      weights[0].scalar_type(), biases.empty() ? std::nullopt : std::optional(biases[0].scalar_type()));
  return {g.x, g.weight, grad_or_slot(g.bias, grad)};
}

}  // namespace
}  // namespace perftrain::python

TORCH_LIBRARY_FRAGMENT(perftrain, m) {
  m.def("linear(Tensor x, Tensor weight, Tensor? bias, Tensor? weight_copy) -> Tensor");
  m.def("linear_backward(Tensor grad, Tensor x, Tensor weight, Tensor? bias, Tensor? weight_copy)"
        " -> (Tensor, Tensor, Tensor)");
  m.def("stacked_linear(Tensor x, Tensor[] weights, Tensor[] biases, Tensor[] weight_copies, Tensor[] bias_copies)"
        " -> Tensor");
  m.def("stacked_linear_backward(Tensor grad, Tensor x, Tensor[] weights, Tensor[] biases, Tensor[] weight_copies)"
        " -> (Tensor, Tensor, Tensor)");
}

// The same kernels for CPU and CUDA (each kernel picks its path by device).
static void register_linear_kernels(torch::Library& m) {
  m.impl("linear", perftrain::python::kernel<&perftrain::python::linear>);
  m.impl("linear_backward", perftrain::python::kernel<&perftrain::python::linear_backward>);
  m.impl("stacked_linear", perftrain::python::kernel<&perftrain::python::stacked_linear>);
  m.impl("stacked_linear_backward", perftrain::python::kernel<&perftrain::python::stacked_linear_backward>);
}

TORCH_LIBRARY_IMPL(perftrain, CPU, m) { register_linear_kernels(m); }

TORCH_LIBRARY_IMPL(perftrain, CUDA, m) { register_linear_kernels(m); }
