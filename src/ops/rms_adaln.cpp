#include "ops/rms_adaln.h"

#include <ATen/TensorOperators.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/rsqrt.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/csrc/autograd/custom_function.h>

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "base/error.h"
#include "kernels/rms_adaln.h"
#include "ops/column_sums.h"
#include "ops/compute_weights.h"
#include "ops/dtype_dispatch.h"
#include "ops/weight_grad_lane.h"

namespace perftrain::ops {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

namespace {

constexpr const char* kOp = "rms_adaln";

std::optional<at::Tensor> optional_tensor(const at::Tensor& t) {
  return t.defined() ? std::optional<at::Tensor>(t) : std::nullopt;
}

void check_args(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& scale, at::ScalarType out_dtype) {
  if (scale.defined())
    detail::check_row_op_args(kOp, x, {}, {{"scale", scale}}, kernels::kRmsAdaLNMaxCols);
  else
    detail::check_row_op_args(kOp, x, {}, {}, kernels::kRmsAdaLNMaxCols);
  detail::check_norm_weight(kOp, x, weight, "weight");
  check_kernel_dtype(kOp, out_dtype, "out_dtype");
}

// Autograd functions take no undefined tensors: the optional weight and scale
// travel as optionals, and an absent one has no input edge, so the edges of
// the present tensors are numbered in order (x = 0, weight, scale).
struct RmsAdaLNFunction : public torch::autograd::Function<RmsAdaLNFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x_in, const std::optional<at::Tensor>& weight_opt,
                            const std::optional<at::Tensor>& scale_opt, int64_t out_dtype_i, double eps) {
    const auto out_dtype = static_cast<at::ScalarType>(out_dtype_i);
    const c10::cuda::CUDAGuard guard(x_in.device());
    const int batch = int(x_in.size(0)), tokens = int(x_in.size(1)), cols = int(x_in.size(2));
    const at::Tensor x = x_in.contiguous();
    // The kernels read the weight as dense fp32 (the master itself, no copy, when it is fp32).
    const at::Tensor weight = weight_opt.has_value() ? compute_weight(*weight_opt, at::kFloat) : at::Tensor();
    const at::Tensor scale = scale_opt.has_value() ? rows_dense(*scale_opt) : at::Tensor();
    const at::ScalarType mod = scale.defined() ? scale.scalar_type() : at::kFloat;
    at::Tensor h = at::empty(x.sizes(), x.options().dtype(out_dtype));
    at::Tensor rstd = at::empty({int64_t(batch) * tokens}, x.options().dtype(at::kFloat));
    // The backward reads xhat where it is narrower than x (see the header).
    const bool keep_xhat = c10::elementSize(out_dtype) == 2 && c10::elementSize(x.scalar_type()) > 2;
    at::Tensor xhat = keep_xhat ? at::empty(x.sizes(), x.options().dtype(out_dtype)) : at::Tensor();
    const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
    with_kernel_types(kOp, x.scalar_type(), mod, out_dtype, [&](auto tx, auto tm, auto ty) {
      using TX = kernel_type<decltype(tx)>;
      using TM = kernel_type<decltype(tm)>;
      using TY = kernel_type<decltype(ty)>;
      kernels::rms_adaln_forward<TX, TM, TY>(kernel_ptr<const TX>(x), kernel_ptr<const float>(weight),
                                             kernel_ptr<const TM>(scale), scale.defined() ? scale.stride(0) : 0,
                                             kernel_ptr<TY>(h), rstd.data_ptr<float>(), kernel_ptr<TY>(xhat), batch,
                                             tokens, cols, float(eps), stream);
    });
    const at::Tensor none;
    ctx->save_for_backward({keep_xhat ? none : x, xhat, weight, scale, rstd});
    ctx->saved_data["out_dtype"] = out_dtype_i;
    ctx->saved_data["x_dtype"] = int64_t(x.scalar_type());
    ctx->saved_data["weight_dtype"] = weight_opt.has_value() ? int64_t(weight_opt->scalar_type()) : int64_t(-1);
    ctx->saved_data["scale_dtype"] = scale_opt.has_value() ? int64_t(scale_opt->scalar_type()) : int64_t(-1);
    return h;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &xhat = saved[1], &weight = saved[2], &scale = saved[3], &rstd = saved[4];
    auto dtype = [&](const char* key) { return static_cast<at::ScalarType>(ctx->saved_data[key].toInt()); };
    const at::ScalarType out_dtype = dtype("out_dtype"), x_dtype = dtype("x_dtype");
    const bool has_weight = ctx->saved_data["weight_dtype"].toInt() >= 0;
    const bool has_scale = ctx->saved_data["scale_dtype"].toInt() >= 0;
    variable_list out(5);  // x, weight, scale, out_dtype, eps
    if (!grads[0].defined()) return out;
    const bool want_weight = has_weight && ctx->needs_input_grad(1);
    const bool want_scale = has_scale && ctx->needs_input_grad(has_weight ? 2 : 1);
    const c10::cuda::CUDAGuard guard(rstd.device());
    // A broadcast or non-contiguous incoming gradient is made dense once.
    const at::Tensor dh = grads[0].to(out_dtype).contiguous();
    const int batch = int(dh.size(0)), tokens = int(dh.size(1)), cols = int(dh.size(2));
    const at::TensorOptions f32 = dh.options().dtype(at::kFloat);
    at::Tensor dx = at::empty(dh.sizes(), dh.options().dtype(x_dtype));
    at::Tensor dscale = want_scale ? at::empty({batch, cols}, scale.options()) : at::Tensor();
    // The weight's gradient per sample (fp32), summed over the batch below.
    at::Tensor dweight_ps = want_weight ? at::empty({batch, cols}, f32) : at::Tensor();
    const int tiles = kernels::rms_adaln_backward_tiles(batch, tokens, cols,
                                                        at::cuda::getCurrentDeviceProperties()->multiProcessorCount);
    // Shape-determined scratch from the caching allocator: fine under graph capture.
    const at::Tensor partials = at::empty({kernels::rms_adaln_backward_partials(batch, tiles, cols)}, f32);
    const at::ScalarType mod = scale.defined() ? scale.scalar_type() : at::kFloat;
    const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
    with_kernel_types(kOp, x_dtype, mod, out_dtype, [&](auto tx, auto tm, auto ty) {
      using TX = kernel_type<decltype(tx)>;
      using TM = kernel_type<decltype(tm)>;
      using TY = kernel_type<decltype(ty)>;
      kernels::rms_adaln_backward<TX, TM, TY>(
          kernel_ptr<const TY>(dh), kernel_ptr<const TX>(x), kernel_ptr<const TY>(xhat), kernel_ptr<const float>(weight),
          kernel_ptr<const TM>(scale), scale.defined() ? scale.stride(0) : 0, rstd.data_ptr<float>(),
          kernel_ptr<TX>(dx), kernel_ptr<TM>(dscale), kernel_ptr<float>(dweight_ps), partials.data_ptr<float>(),
          batch, tokens, cols, tiles, stream);
    });
    if (ctx->needs_input_grad(0)) out[0] = dx;
    if (want_scale) out[2] = dscale.scalar_type() == dtype("scale_dtype") ? dscale : dscale.to(dtype("scale_dtype"));
    // Over the batch in fp32, then one rounding to the weight's dtype; for the
    // optimizer only, so beside the rest of the backward when a weight-gradient
    // scope is open.
    if (want_weight) {
      out[1] = at::empty({cols}, f32.dtype(dtype("weight_dtype")));
      run_weight_grads([&] { batch_sums_into(dweight_ps, out[1]); }, {dweight_ps});
    }
    return out;
  }
};

}  // namespace

namespace detail {

void check_norm_weight(const char* op, const at::Tensor& x, const at::Tensor& weight, const char* what) {
  if (!weight.defined()) return;
  const std::string o = std::string(op) + ": " + what;
  const int64_t d = x.size(-1);
  if (weight.dim() != 1 || weight.size(0) != d)
    throw UsageError(o + " must be [" + std::to_string(d) + "] (x is " + shape(x) + "), got " + shape(weight));
  const at::ScalarType t = weight.scalar_type();
  if (!is_kernel_dtype(t) && t != at::kDouble)
    throw UsageError(o + " must be float32, bfloat16, float16 or float64, got " + c10::toString(t));
  if (weight.device() != x.device())
    throw UsageError(std::string(op) + ": x is on " + x.device().str() + " but " + what + " is on " +
                     weight.device().str());
}

}  // namespace detail

at::Tensor rms_adaln_reference(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& scale,
                               at::ScalarType out_dtype, double eps) {
  const bool f64 = x.scalar_type() == at::kDouble || (weight.defined() && weight.scalar_type() == at::kDouble) ||
                   (scale.defined() && scale.scalar_type() == at::kDouble);
  const at::ScalarType ct = f64 ? at::kDouble : at::kFloat;
  const at::Tensor xf = x.to(ct);
  at::Tensor h = xf * at::rsqrt((xf * xf).mean({-1}, /*keepdim=*/true) + eps);
  if (weight.defined()) h = h * weight.to(ct);
  if (scale.defined()) h = h * (scale.to(ct).unsqueeze(1) + 1);
  return h.to(out_dtype);
}

at::Tensor rms_adaln(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& scale,
                     at::ScalarType out_dtype, double eps) {
  check_args(x, weight, scale, out_dtype);
  if (!x.is_cuda()) return rms_adaln_reference(x, weight, scale, out_dtype, eps);
  return RmsAdaLNFunction::apply(x, optional_tensor(weight), optional_tensor(scale), int64_t(out_dtype), eps);
}

}  // namespace perftrain::ops
