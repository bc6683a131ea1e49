#include "ops/adaln_layernorm.h"

#include <ATen/TensorOperators.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/csrc/autograd/custom_function.h>

#include <optional>
#include <vector>

#include "base/error.h"
#include "kernels/adaln_layernorm.h"
#include "ops/dtype_dispatch.h"
#include "ops/row_norm_op.h"

namespace perftrain::ops {

namespace {

constexpr const char* kOp = "adaln_layernorm";

// fp8_scale / fp8_amax (both or neither): the codes as a second output (no gradient).
struct AdaLNLayerNormFunction : public torch::autograd::Function<AdaLNLayerNormFunction> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x_in, const at::Tensor& shift_in,
                               const at::Tensor& scale_in, int64_t out_dtype_i, double eps,
                               const std::optional<at::Tensor>& fp8_scale, const std::optional<at::Tensor>& fp8_amax) {
    const Fp8Target target{fp8_scale.value_or(at::Tensor()), fp8_amax.value_or(at::Tensor())};
    const detail::AdaLNLayerNormForward f = detail::adaln_layernorm_forward_cuda(
        x_in, shift_in, scale_in, static_cast<at::ScalarType>(out_dtype_i), eps, fp8_scale ? &target : nullptr);
    ctx->save_for_backward({f.x, f.scale, f.mean, f.rstd});
    ctx->saved_data["out_dtype"] = out_dtype_i;
    detail::save_dtypes(ctx, {{"shift_dtype", &shift_in}, {"scale_dtype", &scale_in}});
    if (!f.codes.defined()) return {f.h};
    // The codes take no gradient: it arrives undefined, not as an fp8 zero fill each step.
    ctx->set_materialize_grads(false);
    ctx->mark_non_differentiable({f.codes});
    return {f.h, f.codes};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    if (!grads[0].defined()) return variable_list(7);
    const detail::AdaLNLayerNormGrads g = detail::adaln_layernorm_backward_cuda(
        grads[0], saved[0], saved[1], saved[2], saved[3],
        static_cast<at::ScalarType>(ctx->saved_data["out_dtype"].toInt()), detail::saved_dtype(ctx, "shift_dtype"),
        detail::saved_dtype(ctx, "scale_dtype"));
    return {g.x, g.shift, g.scale, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

namespace detail {

void check_adaln_layernorm_args(const at::Tensor& x, const at::Tensor& shift, const at::Tensor& scale,
                                at::ScalarType out_dtype) {
  check_row_norm_args(kOp, x, {}, {{"shift", shift}, {"scale", scale}}, {}, kernels::kAdaLNMaxCols, out_dtype);
}

AdaLNLayerNormForward adaln_layernorm_forward_cuda(const at::Tensor& x_in, const at::Tensor& shift_in,
                                                   const at::Tensor& scale_in, at::ScalarType out_dtype, double eps,
                                                   const Fp8Target* fp8) {
  const c10::cuda::CUDAGuard guard(x_in.device());
  const std::vector<at::Tensor> mod = per_sample_rows({shift_in, scale_in});
  const at::Tensor &shift = mod[0], &scale = mod[1];
  RowNormTensors t = row_norm_tensors(x_in, at::Tensor(), out_dtype, /*keep_xhat=*/false, /*stat=*/true, fp8);
  const FusedFp8Output q = fused_fp8_output(fp8, t, out_dtype, kOp);
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  with_kernel_types(kOp, t.x.scalar_type(), shift.scalar_type(), out_dtype, [&](auto tx, auto tm, auto ty) {
    using TX = kernel_type<decltype(tx)>;
    using TM = kernel_type<decltype(tm)>;
    using TY = kernel_type<decltype(ty)>;
    kernels::adaln_layernorm_forward<TX, TM, TY>(
        kernel_ptr<const TX>(t.x), kernel_ptr<const TM>(shift), shift.stride(0), kernel_ptr<const TM>(scale),
        scale.stride(0), q.fused ? nullptr : kernel_ptr<TY>(t.h), t.stat.data_ptr<float>(), t.rstd.data_ptr<float>(),
        t.batch, t.tokens, t.cols, float(eps), stream, q.kernel);
  });
  const FinishedFp8Output out = finish_fp8_output(q, fp8, t, out_dtype, kOp);
  return {out.h, t.x, scale, t.stat, t.rstd, out.codes};
}

AdaLNLayerNormGrads adaln_layernorm_backward_cuda(const at::Tensor& dh, const at::Tensor& x, const at::Tensor& scale,
                                                  const at::Tensor& mean, const at::Tensor& rstd,
                                                  at::ScalarType out_dtype, at::ScalarType shift_dtype,
                                                  at::ScalarType scale_dtype) {
  const c10::cuda::CUDAGuard guard(x.device());
  const int batch = int(x.size(0)), tokens = int(x.size(1)), cols = int(x.size(2));
  const at::Tensor dy = dense_grad(dh, out_dtype);
  at::Tensor dx = at::empty_like(x);
  at::Tensor dshift = at::empty({batch, cols}, scale.options());
  at::Tensor dscale = at::empty_like(dshift);
  const int tiles = kernels::adaln_layernorm_backward_tiles(batch, tokens, sm_count());
  const at::Tensor partials = f32_scratch(2 * int64_t(batch) * tiles * cols, x);
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  with_kernel_types(kOp, x.scalar_type(), scale.scalar_type(), out_dtype, [&](auto tx, auto tm, auto ty) {
    using TX = kernel_type<decltype(tx)>;
    using TM = kernel_type<decltype(tm)>;
    using TY = kernel_type<decltype(ty)>;
    kernels::adaln_layernorm_backward<TX, TM, TY>(
        kernel_ptr<const TY>(dy), kernel_ptr<const TX>(x), kernel_ptr<const TM>(scale), scale.stride(0),
        mean.data_ptr<float>(), rstd.data_ptr<float>(), kernel_ptr<TX>(dx), kernel_ptr<TM>(dshift),
        kernel_ptr<TM>(dscale), partials.data_ptr<float>(), batch, tokens, cols, tiles, stream);
  });
  return {dx, as_dtype(dshift, shift_dtype), as_dtype(dscale, scale_dtype)};
}

}  // namespace detail

at::Tensor adaln_layernorm_reference(const at::Tensor& x, const at::Tensor& shift, const at::Tensor& scale,
                                     at::ScalarType out_dtype, double eps) {
  const bool f64 =
      x.scalar_type() == at::kDouble || shift.scalar_type() == at::kDouble || scale.scalar_type() == at::kDouble;
  const at::ScalarType ct = f64 ? at::kDouble : at::kFloat;
  const at::Tensor xf = x.to(ct);
  const at::Tensor centred = xf - xf.mean({-1}, /*keepdim=*/true);
  const at::Tensor var = (centred * centred).mean({-1}, /*keepdim=*/true);
  const at::Tensor xhat = centred * (var + eps).rsqrt();
  return (xhat * (scale.to(ct).unsqueeze(1) + 1) + shift.to(ct).unsqueeze(1)).to(out_dtype);
}

at::Tensor adaln_layernorm(const at::Tensor& x, const at::Tensor& shift, const at::Tensor& scale,
                           at::ScalarType out_dtype, double eps) {
  detail::check_adaln_layernorm_args(x, shift, scale, out_dtype);
  if (!x.is_cuda()) return adaln_layernorm_reference(x, shift, scale, out_dtype, eps);
  return AdaLNLayerNormFunction::apply(x, shift, scale, int64_t(out_dtype), eps, std::nullopt, std::nullopt)[0];
}

Fp8Operand adaln_layernorm_fp8(const at::Tensor& x, const at::Tensor& shift, const at::Tensor& scale,
                               at::ScalarType out_dtype, const Fp8Target& target, double eps) {
  detail::check_adaln_layernorm_args(x, shift, scale, out_dtype);
  if (!x.is_cuda()) return fp8_operand_of(adaln_layernorm_reference(x, shift, scale, out_dtype, eps), target, kOp);
  variable_list out =
      AdaLNLayerNormFunction::apply(x, shift, scale, int64_t(out_dtype), eps, target.scale, target.amax);
  return {std::move(out[0]), std::move(out[1]), at::Tensor()};
}

}  // namespace perftrain::ops
