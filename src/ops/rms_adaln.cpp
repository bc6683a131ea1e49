#include "ops/rms_adaln.h"

#include <ATen/TensorOperators.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/rsqrt.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/csrc/autograd/custom_function.h>

#include <optional>
#include <vector>

#include "base/error.h"
#include "kernels/rms_adaln.h"
#include "ops/compute_weights.h"
#include "ops/dtype_dispatch.h"
#include "ops/row_norm_op.h"

namespace perftrain::ops {

namespace {

constexpr const char* kOp = "rms_adaln";

// The optional weight and scale travel as optionals (detail::optional_tensor),
// and an absent one has no input edge, so the edges of the present tensors are
// numbered in order (x = 0, weight, scale).
struct RmsAdaLNFunction : public torch::autograd::Function<RmsAdaLNFunction> {
  // fp8_scale / fp8_amax (both or neither): h's codes as a second output (no gradient).
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x_in,
                               const std::optional<at::Tensor>& weight_opt, const std::optional<at::Tensor>& scale_opt,
                               int64_t out_dtype_i, double eps, const std::optional<at::Tensor>& fp8_scale,
                               const std::optional<at::Tensor>& fp8_amax) {
    const at::Tensor weight_in = weight_opt.value_or(at::Tensor()), scale_in = scale_opt.value_or(at::Tensor());
    const Fp8Target target{fp8_scale.value_or(at::Tensor()), fp8_amax.value_or(at::Tensor())};
    const detail::RmsAdaLNForward f = detail::rms_adaln_forward_cuda(
        x_in, weight_in, scale_in, static_cast<at::ScalarType>(out_dtype_i), eps, fp8_scale ? &target : nullptr);
    ctx->save_for_backward({f.x, f.xhat, f.weight, f.scale, f.rstd});
    ctx->saved_data["out_dtype"] = out_dtype_i;
    detail::save_dtypes(ctx, {{"x_dtype", &x_in}, {"weight_dtype", &weight_in}, {"scale_dtype", &scale_in}});
    if (!f.codes.defined()) return {f.h};
    // The codes take no gradient: it arrives undefined, not as an fp8 zero fill each step.
    ctx->set_materialize_grads(false);
    ctx->mark_non_differentiable({f.codes});
    return {f.h, f.codes};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    detail::RmsAdaLNForward s;
    s.x = saved[0], s.xhat = saved[1], s.weight = saved[2], s.scale = saved[3], s.rstd = saved[4];
    const auto present = [&](const char* key) {
      return detail::saved_present(ctx, key) ? std::optional<at::ScalarType>(detail::saved_dtype(ctx, key))
                                             : std::nullopt;
    };
    const std::optional<at::ScalarType> weight_dtype = present("weight_dtype"), scale_dtype = present("scale_dtype");
    const bool has_weight = weight_dtype.has_value();
    variable_list out(7);  // x, weight, scale, out_dtype, eps, fp8_scale, fp8_amax
    if (!grads[0].defined()) return out;
    const detail::RmsAdaLNGrads g = detail::rms_adaln_backward_cuda(
        grads[0], s, detail::saved_dtype(ctx, "out_dtype"), detail::saved_dtype(ctx, "x_dtype"),
        has_weight && ctx->needs_input_grad(1) ? weight_dtype : std::nullopt,
        scale_dtype.has_value() && ctx->needs_input_grad(has_weight ? 2 : 1) ? scale_dtype : std::nullopt);
    if (ctx->needs_input_grad(0)) out[0] = g.x;
    out[1] = g.weight, out[2] = g.scale;
    return out;
  }
};

}  // namespace

namespace detail {

void check_rms_adaln_args(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& scale,
                          at::ScalarType out_dtype) {
  check_row_norm_args(kOp, x, {}, {}, {{"scale", scale}}, kernels::kRmsAdaLNMaxCols, out_dtype);
  check_norm_weight(kOp, x, weight, "weight");
}

RmsAdaLNForward rms_adaln_forward_cuda(const at::Tensor& x_in, const at::Tensor& weight_in,
                                       const at::Tensor& scale_in, at::ScalarType out_dtype, double eps,
                                       const Fp8Target* fp8) {
  const c10::cuda::CUDAGuard guard(x_in.device());
  // The kernels read the weight as dense fp32 (the master itself, no copy, when it is fp32).
  const at::Tensor weight = weight_in.defined() ? compute_weight(weight_in, at::kFloat) : at::Tensor();
  const at::Tensor scale = per_sample_rows({scale_in})[0];
  const at::ScalarType mod = scale.defined() ? scale.scalar_type() : at::kFloat;
  // The backward reads xhat where it is narrower than x (see the header).
  RowNormTensors t = row_norm_tensors(x_in, at::Tensor(), out_dtype, /*keep_xhat=*/true, /*stat=*/false, fp8);
  const FusedFp8Output q = fused_fp8_output(fp8, t, out_dtype, kOp);
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  with_kernel_types(kOp, t.x.scalar_type(), mod, out_dtype, [&](auto tx, auto tm, auto ty) {
    using TX = kernel_type<decltype(tx)>;
    using TM = kernel_type<decltype(tm)>;
    using TY = kernel_type<decltype(ty)>;
    kernels::rms_adaln_forward<TX, TM, TY>(kernel_ptr<const TX>(t.x), kernel_ptr<const float>(weight),
                                           kernel_ptr<const TM>(scale), scale.defined() ? scale.stride(0) : 0,
                                           q.fused ? nullptr : kernel_ptr<TY>(t.h), t.rstd.data_ptr<float>(),
                                           kernel_ptr<TY>(t.xhat), t.batch, t.tokens, t.cols, float(eps), stream,
                                           q.kernel);
  });
  const FinishedFp8Output out = finish_fp8_output(q, fp8, t, out_dtype, kOp);
  RmsAdaLNForward f;
  f.h = out.h, f.codes = out.codes, f.x = t.xhat.defined() ? at::Tensor() : t.x, f.xhat = t.xhat, f.weight = weight, f.scale = scale;
  f.rstd = t.rstd;
  return f;
}

RmsAdaLNGrads rms_adaln_backward_cuda(const at::Tensor& grad, const RmsAdaLNForward& saved, at::ScalarType out_dtype,
                                      at::ScalarType x_dtype, std::optional<at::ScalarType> weight_dtype,
                                      std::optional<at::ScalarType> scale_dtype) {
  const at::Tensor &x = saved.x, &xhat = saved.xhat, &weight = saved.weight, &scale = saved.scale,
                   &rstd = saved.rstd;
  const bool want_weight = weight_dtype.has_value(), want_scale = scale_dtype.has_value();
  const c10::cuda::CUDAGuard guard(rstd.device());
  const at::Tensor dh = dense_grad(grad, out_dtype);
  const int batch = int(dh.size(0)), tokens = int(dh.size(1)), cols = int(dh.size(2));
  const at::TensorOptions f32 = dh.options().dtype(at::kFloat);
  at::Tensor dx = at::empty(dh.sizes(), dh.options().dtype(x_dtype));
  at::Tensor dscale = want_scale ? at::empty({batch, cols}, scale.options()) : at::Tensor();
  // The weight's gradient per sample (fp32), summed over the batch below.
  at::Tensor dweight_ps = want_weight ? at::empty({batch, cols}, f32) : at::Tensor();
  const int tiles = kernels::rms_adaln_backward_tiles(batch, tokens, cols, sm_count());
  const at::Tensor partials = f32_scratch(kernels::rms_adaln_backward_partials(batch, tiles, cols), dh);
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
RmsAdaLNGrads out;
  out.x = dx;
  if (want_scale) out.scale = as_dtype(dscale, *scale_dtype);
  if (want_weight) out.weight = batch_sums_on_lane({{dweight_ps, *weight_dtype}})[0];
  return out;
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
  detail::check_rms_adaln_args(x, weight, scale, out_dtype);
  if (!x.is_cuda()) return rms_adaln_reference(x, weight, scale, out_dtype, eps);
  return RmsAdaLNFunction::apply(x, detail::optional_tensor(weight), detail::optional_tensor(scale), int64_t(out_dtype),
                                 eps, std::nullopt, std::nullopt)[0];
}

Fp8Operand rms_adaln_fp8(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& scale,
                         at::ScalarType out_dtype, const Fp8Target& target, double eps) {
  detail::check_rms_adaln_args(x, weight, scale, out_dtype);
  if (!x.is_cuda()) return fp8_operand_of(rms_adaln_reference(x, weight, scale, out_dtype, eps), target, kOp);
  variable_list out = RmsAdaLNFunction::apply(x, detail::optional_tensor(weight), detail::optional_tensor(scale),
                                              int64_t(out_dtype), eps, target.scale, target.amax);
  return {std::move(out[0]), std::move(out[1]), at::Tensor()};
}

}  // namespace perftrain::ops
