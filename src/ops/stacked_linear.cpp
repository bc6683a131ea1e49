#include "ops/stacked_linear.h"

#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/linear.h>
#include <c10/core/DeviceGuard.h>
#include <torch/csrc/autograd/custom_function.h>

#include <string>

#include "base/error.h"
#include "ops/compute_weights.h"
#include "ops/linear.h"
#include "ops/weight_grad_stream.h"

namespace perftrain::ops {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

namespace detail {

at::Tensor stacked_rows(const std::vector<at::Tensor>& parts) {
  bool adjacent = parts[0].is_contiguous();
  int64_t rows = parts[0].size(0);
  for (size_t i = 1; i < parts.size() && adjacent; ++i) {
    const at::Tensor &a = parts[i - 1], &b = parts[i];
    adjacent = b.is_contiguous() && b.is_alias_of(a) &&
               b.storage_offset() == a.storage_offset() + a.numel() && b.sizes().slice(1) == a.sizes().slice(1);
    rows += b.size(0);
  }
  if (!adjacent) return at::cat(parts, 0);
  std::vector<int64_t> sizes = parts[0].sizes().vec();
  sizes[0] = rows;
  return parts[0].as_strided(sizes, parts[0].strides(), parts[0].storage_offset());
}

std::vector<at::Tensor> row_blocks(const at::Tensor& t, const std::vector<int64_t>& rows) {
  std::vector<at::Tensor> out;
  int64_t offset = 0;
  for (const int64_t r : rows) {
    out.push_back(t.defined() ? t.narrow(0, offset, r) : at::Tensor());
    offset += r;
  }
  return out;
}

void check_stacked_linear_args(const at::Tensor& x, const std::vector<at::Tensor>& weights, const std::vector<at::Tensor>& biases) {
  if (weights.empty()) throw UsageError("stacked_linear: at least one weight");
  if (!biases.empty() && biases.size() != weights.size())
    throw UsageError("stacked_linear: " + std::to_string(weights.size()) + " weights but " +
                     std::to_string(biases.size()) + " biases (none, or one per weight)");
  for (size_t i = 0; i < weights.size(); ++i) {
    check_linear_args("stacked_linear", x, weights[i], biases.empty() ? at::Tensor() : biases[i]);
    if (weights[i].scalar_type() != weights[0].scalar_type() ||
        (!biases.empty() && biases[i].scalar_type() != biases[0].scalar_type()))
      throw UsageError("stacked_linear: the weights must share one dtype, and the biases one");
  }
}

at::Tensor stacked_linear_forward(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) {
  const c10::DeviceGuard device_guard(x.device());
  const int64_t k = x.size(-1), m = x.numel() / k, n = w.size(0);
  std::vector<int64_t> out_sizes = x.sizes().vec();
  out_sizes.back() = n;
  at::Tensor y = at::empty(out_sizes, x.options());
  linear_forward_product(x.contiguous().view({m, k}), w, b, y.view({m, n}));
  return y;
}

StackedLinearGrads stacked_linear_backward(const at::Tensor& grad, const at::Tensor& x2, const at::Tensor& w,
                                           at::IntArrayRef x_sizes, at::ScalarType dtype, bool want_x,
                                           std::optional<at::ScalarType> w_dtype,
                                           std::optional<at::ScalarType> b_dtype) {
  const c10::DeviceGuard device_guard(grad.device());
  const int64_t k = x_sizes.back(), n = grad.size(-1), m = grad.numel() / n;
  const at::Tensor dy = grad.to(dtype).contiguous().view({m, n});
  StackedLinearGrads g;
  // All weights' gradients in one product (and the biases' in one column
  // sum), beside the input gradient when the step runs two streams; the
  // caller hands each layer its row block.
  if (w_dtype) g.weight = at::empty({n, k}, dy.options().dtype(*w_dtype));
  if (b_dtype) g.bias = at::empty({n}, dy.options().dtype(*b_dtype));
  if (w_dtype || b_dtype) run_weight_grads([&] { linear_weight_grad_into(dy, x2, g.weight, g.bias); }, {dy, x2});
  if (want_x) {
    g.x = at::empty(x_sizes, dy.options());
    linear_input_grad(dy, w, g.x.view({m, k}));
  }
  return g;
}

at::Tensor stacked_weights_in(at::TensorList parts, at::ScalarType dtype) {
  std::vector<at::Tensor> out;
  for (const auto& t : parts) out.push_back(compute_weight(t, dtype));  // the optimizer's copies, or casts
  return stacked_rows(out);
}

namespace {

struct StackedLinearFunction : public torch::autograd::Function<StackedLinearFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, at::TensorList weights,
                            at::TensorList biases) {
    const at::ScalarType dt = x.scalar_type();
    std::vector<int64_t> rows;
    for (const auto& w : weights) rows.push_back(w.size(0));
    const at::Tensor w = stacked_weights_in(weights, dt);
    const at::Tensor b = biases.empty() ? at::Tensor() : stacked_weights_in(biases, dt);
    const at::Tensor y = stacked_linear_forward(x, w, b);
    bool weights_grad = false;
    for (const auto& t : weights) weights_grad = weights_grad || t.requires_grad();
    const int64_t k = x.size(-1);
    ctx->save_for_backward({weights_grad ? x.contiguous().view({x.numel() / k, k}) : at::Tensor(),
                            x.requires_grad() ? w : at::Tensor()});
    ctx->saved_data["x_sizes"] = x.sizes().vec();
    ctx->saved_data["rows"] = rows;
    ctx->saved_data["dtype"] = int64_t(dt);
    ctx->saved_data["w_dtype"] = int64_t(weights[0].scalar_type());
    ctx->saved_data["b_dtype"] = biases.empty() ? int64_t(-1) : int64_t(biases[0].scalar_type());
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const std::vector<int64_t> rows = ctx->saved_data["rows"].toIntVector();
    const int64_t b_dtype = ctx->saved_data["b_dtype"].toInt();
    const size_t count = rows.size();
    variable_list out(1 + count + (b_dtype >= 0 ? count : 0));
    if (!grads[0].defined()) return out;
    bool want_w = false, want_b = false;
    for (size_t i = 0; i < count; ++i) {
      want_w = want_w || ctx->needs_input_grad(1 + i);
      want_b = want_b || (b_dtype >= 0 && ctx->needs_input_grad(1 + count + i));
    }
    const StackedLinearGrads g = stacked_linear_backward(
        grads[0], saved[0], saved[1], ctx->saved_data["x_sizes"].toIntVector(),
        static_cast<at::ScalarType>(ctx->saved_data["dtype"].toInt()), ctx->needs_input_grad(0),
        want_w ? std::optional(static_cast<at::ScalarType>(ctx->saved_data["w_dtype"].toInt())) : std::nullopt,
        want_b ? std::optional(static_cast<at::ScalarType>(b_dtype)) : std::nullopt);
    const std::vector<at::Tensor> dw = row_blocks(g.weight, rows), db = row_blocks(g.bias, rows);
    for (size_t i = 0; i < count; ++i) {
      if (want_w && ctx->needs_input_grad(1 + i)) out[1 + i] = dw[i];
      if (want_b && ctx->needs_input_grad(1 + count + i)) out[1 + count + i] = db[i];
    }
    out[0] = g.x;
    return out;
  }
};

}  // namespace

at::Tensor stacked_linear_function(const at::Tensor& x, const std::vector<at::Tensor>& weights,
                                   const std::vector<at::Tensor>& biases) {
  check_stacked_linear_args(x, weights, biases);
  return StackedLinearFunction::apply(x, at::TensorList(weights), at::TensorList(biases));
}

}  // namespace detail

at::Tensor stacked_linear_reference(const at::Tensor& x, const std::vector<at::Tensor>& weights,
                                    const std::vector<at::Tensor>& biases) {
  std::vector<at::Tensor> w32, b32;
  for (const auto& w : weights) w32.push_back(w.to(at::kFloat));
  for (const auto& b : biases) b32.push_back(b.to(at::kFloat));
  return at::linear(x.to(at::kFloat), at::cat(w32, 0), b32.empty() ? at::Tensor() : at::cat(b32, 0));
}

at::Tensor stacked_linear(const at::Tensor& x, const std::vector<at::Tensor>& weights,
                          const std::vector<at::Tensor>& biases) {
  detail::check_stacked_linear_args(x, weights, biases);
  if (!x.is_cuda()) return stacked_linear_reference(x, weights, biases).to(x.scalar_type());
  return detail::StackedLinearFunction::apply(x, at::TensorList(weights), at::TensorList(biases));
}

}  // namespace perftrain::ops
