#include "ops/gated_residual.h"

#include <ATen/TensorOperators.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/csrc/autograd/custom_function.h>

#include <optional>
#include <string>
#include <utility>

#include "base/error.h"
#include "kernels/gated_residual.h"
#include "ops/column_sums.h"
#include "ops/dtype_dispatch.h"
#include "ops/weight_grad_stream.h"

namespace perftrain::ops {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

namespace {

constexpr const char* kOp = "gated_residual";

void check_args(const at::Tensor& x, const at::Tensor& gate, const at::Tensor& y) {
  detail::check_row_op_args(kOp, x, {{"y", y}}, {{"gate", gate}}, kernels::kGatedResidualMaxCols);
}

std::optional<at::Tensor> optional_bias(const at::Tensor& bias) {
  return bias.defined() ? std::optional<at::Tensor>(bias) : std::nullopt;
}

// The bias travels as an optional: autograd functions take no undefined
// tensors, but an absent optional is "no input here" (and has no gradient slot
// among the input edges: needs_input_grad(3) exists only when it is present).
struct GatedResidualFunction : public torch::autograd::Function<GatedResidualFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x_in, const at::Tensor& gate_in,
                            const at::Tensor& y_in, const std::optional<at::Tensor>& bias_opt) {
    const c10::cuda::CUDAGuard guard(x_in.device());
    const int batch = int(x_in.size(0)), tokens = int(x_in.size(1)), cols = int(x_in.size(2));
    const at::Tensor x = x_in.contiguous(), y = y_in.contiguous();
    const at::Tensor gate = rows_dense(gate_in);
    // The kernels read the bias as dense fp32 (no copy when it already is).
    const at::Tensor bias = bias_opt.has_value() ? bias_opt->to(at::kFloat).contiguous() : at::Tensor();
    at::Tensor out = at::empty(x.sizes(), x.options());
    const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
    with_kernel_types(kOp, x.scalar_type(), gate.scalar_type(), y.scalar_type(), [&](auto tx, auto tg, auto ty) {
      using TX = kernel_type<decltype(tx)>;
      using TG = kernel_type<decltype(tg)>;
      using TY = kernel_type<decltype(ty)>;
      kernels::gated_residual_forward<TX, TG, TY>(kernel_ptr<const TX>(x), kernel_ptr<const TG>(gate), gate.stride(0),
                                                  kernel_ptr<const TY>(y), kernel_ptr<const float>(bias),
                                                  kernel_ptr<TX>(out), batch, tokens, cols, stream);
    });
    // dy needs gate, dgate needs y and the bias; x is not needed at all.
    ctx->save_for_backward({gate, y, bias});
    ctx->saved_data["x_dtype"] = int64_t(x.scalar_type());
    ctx->saved_data["bias_dtype"] = bias_opt.has_value() ? int64_t(bias_opt->scalar_type()) : int64_t(-1);
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor &gate = saved[0], &y = saved[1], &bias = saved[2];
    const auto x_dtype = static_cast<at::ScalarType>(ctx->saved_data["x_dtype"].toInt());
    const int64_t bias_dtype = ctx->saved_data["bias_dtype"].toInt();
    const at::Tensor& dout_in = grads[0];
    if (!dout_in.defined()) return {at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
    const bool want_bias = bias_dtype >= 0 && ctx->needs_input_grad(3);
    const detail::GatedResidualGrads g =
        detail::gated_residual_backward_cuda(dout_in, gate, y, bias, x_dtype, ctx->needs_input_grad(1),
                                             ctx->needs_input_grad(2),
                                             want_bias ? std::optional<at::ScalarType>(at::ScalarType(bias_dtype))
                                                       : std::nullopt);
    return {dout_in, g.gate, g.y, g.bias};
  }
};

}  // namespace

namespace detail {

GatedResidualGrads gated_residual_backward_cuda(const at::Tensor& dout_in, const at::Tensor& gate_in,
                                                const at::Tensor& y_in, const at::Tensor& bias_in,
                                                at::ScalarType x_dtype, bool want_gate, bool want_y,
                                                std::optional<at::ScalarType> bias_dtype) {
  const bool want_bias = bias_dtype.has_value();
  if (!want_gate && !want_y && !want_bias) return {};
  const c10::cuda::CUDAGuard guard(y_in.device());
  // As the forward reads them (no copy when they already are: the saved ones).
  const at::Tensor gate = rows_dense(gate_in), y = y_in.contiguous();
  const at::Tensor bias = bias_in.defined() ? bias_in.to(at::kFloat).contiguous() : at::Tensor();
  const int batch = int(y.size(0)), tokens = int(y.size(1)), cols = int(y.size(2));
  // A broadcast or non-contiguous incoming gradient is made dense once (the
  // autograd function returns the incoming tensor itself as dx).
  const at::Tensor dout = dout_in.to(x_dtype).contiguous();
  at::Tensor dy = at::empty_like(y);
  at::Tensor dgate = at::empty({batch, cols}, gate.options());
  at::Tensor dbias_ps = want_bias ? at::empty({batch, cols}, y.options().dtype(at::kFloat)) : at::Tensor();
  // The bias enters dgate only; without a wanted dgate the kernel may leave it out.
  const float* bias_ptr = want_gate && bias.defined() ? bias.data_ptr<float>() : nullptr;
  const int tiles = kernels::gated_residual_backward_tiles(
      batch, tokens, at::cuda::getCurrentDeviceProperties()->multiProcessorCount);
  // Shape-determined scratch from the caching allocator: fine under graph capture.
  at::Tensor partials = at::empty(
      {kernels::gated_residual_backward_partials(batch, tiles, cols, bias_ptr != nullptr || want_bias)},
      y.options().dtype(at::kFloat));
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  with_kernel_types(kOp, x_dtype, gate.scalar_type(), y.scalar_type(), [&](auto tx, auto tg, auto ty) {
    using TX = kernel_type<decltype(tx)>;
    using TG = kernel_type<decltype(tg)>;
    using TY = kernel_type<decltype(ty)>;
    kernels::gated_residual_backward<TX, TG, TY>(kernel_ptr<const TX>(dout), kernel_ptr<const TG>(gate),
                                                 gate.stride(0), kernel_ptr<const TY>(y), bias_ptr, kernel_ptr<TY>(dy),
                                                 kernel_ptr<TG>(dgate), kernel_ptr<float>(dbias_ps),
                                                 partials.data_ptr<float>(), batch, tokens, cols, tiles, stream);
  });
  GatedResidualGrads grads;
  if (want_gate) grads.gate = dgate;
  if (want_y) grads.y = dy;
  if (want_bias) {  // for the optimizer only: beside the rest of the backward (ops/weight_grad_stream.h)
    grads.bias = at::empty({cols}, y.options().dtype(*bias_dtype));
    run_weight_grads([&] { batch_sums_into(dbias_ps, grads.bias); }, {dbias_ps});
  }
  return grads;
}

void check_residual_bias(const char* op, const at::Tensor& x, const at::Tensor& bias) {
  if (!bias.defined()) return;
  const int64_t d = x.size(-1);
  if (bias.dim() != 1 || bias.size(0) != d)
    throw UsageError(std::string(op) + ": bias must be [" + std::to_string(d) + "] (x is " + shape(x) + "), got " +
                     shape(bias));
  const at::ScalarType t = bias.scalar_type();
  if (!is_kernel_dtype(t) && t != at::kDouble)
    throw UsageError(std::string(op) + ": bias must be float32, bfloat16, float16 or float64, got " +
                     c10::toString(t));
  if (bias.device() != x.device())
    throw UsageError(std::string(op) + ": x is on " + x.device().str() + " but bias is on " + bias.device().str());
}

}  // namespace detail

at::Tensor gated_residual_reference(const at::Tensor& x, const at::Tensor& gate, const at::Tensor& y,
                                    const at::Tensor& bias) {
  const bool f64 = x.scalar_type() == at::kDouble || gate.scalar_type() == at::kDouble ||
                   y.scalar_type() == at::kDouble || (bias.defined() && bias.scalar_type() == at::kDouble);
  const at::ScalarType ct = f64 ? at::kDouble : at::kFloat;
  const at::Tensor v = bias.defined() ? y.to(ct) + bias.to(ct) : y.to(ct);
  return (x.to(ct) + gate.to(ct).unsqueeze(1) * v).to(x.scalar_type());
}

at::Tensor gated_residual(const at::Tensor& x, const at::Tensor& gate, const at::Tensor& y, const at::Tensor& bias) {
  check_args(x, gate, y);
  detail::check_residual_bias(kOp, x, bias);
  if (!x.is_cuda()) return gated_residual_reference(x, gate, y, bias);
  return GatedResidualFunction::apply(x, gate, y, optional_bias(bias));
}

}  // namespace perftrain::ops
