#include "ops/adaln_layernorm.h"

#include <ATen/TensorOperators.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/csrc/autograd/custom_function.h>

#include "base/error.h"
#include "kernels/adaln_layernorm.h"
#include "ops/dtype_dispatch.h"

namespace perftrain::ops {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

namespace {

constexpr const char* kOp = "adaln_layernorm";

void check_args(const at::Tensor& x, const at::Tensor& shift, const at::Tensor& scale, at::ScalarType out_dtype) {
  detail::check_row_op_args(kOp, x, {}, {{"shift", shift}, {"scale", scale}}, kernels::kAdaLNMaxCols);
  check_kernel_dtype(kOp, out_dtype, "out_dtype");
}

struct AdaLNLayerNormFunction : public torch::autograd::Function<AdaLNLayerNormFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x_in, const at::Tensor& shift_in,
                            const at::Tensor& scale_in, int64_t out_dtype_i, double eps) {
    const auto out_dtype = static_cast<at::ScalarType>(out_dtype_i);
    const c10::cuda::CUDAGuard guard(x_in.device());
    const int batch = int(x_in.size(0)), tokens = int(x_in.size(1)), cols = int(x_in.size(2));
    const at::Tensor x = x_in.contiguous();
    // shift and scale share one kernel type; mixed dtypes meet in fp32 (tiny tensors).
    const bool same = shift_in.scalar_type() == scale_in.scalar_type();
    const at::Tensor shift = rows_dense(same ? shift_in : shift_in.to(at::kFloat));
    const at::Tensor scale = rows_dense(same ? scale_in : scale_in.to(at::kFloat));
    at::Tensor y = at::empty(x.sizes(), x.options().dtype(out_dtype));
    at::Tensor mean = at::empty({int64_t(batch) * tokens}, x.options().dtype(at::kFloat));
    at::Tensor rstd = at::empty_like(mean);
    const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
    with_kernel_types(kOp, x.scalar_type(), shift.scalar_type(), out_dtype, [&](auto tx, auto tm, auto ty) {
      using TX = kernel_type<decltype(tx)>;
      using TM = kernel_type<decltype(tm)>;
      using TY = kernel_type<decltype(ty)>;
      kernels::adaln_layernorm_forward<TX, TM, TY>(kernel_ptr<const TX>(x), kernel_ptr<const TM>(shift),
                                                   shift.stride(0), kernel_ptr<const TM>(scale), scale.stride(0),
                                                   kernel_ptr<TY>(y), mean.data_ptr<float>(), rstd.data_ptr<float>(),
                                                   batch, tokens, cols, float(eps), stream);
    });
    ctx->save_for_backward({x, scale, mean, rstd});
    ctx->saved_data["out_dtype"] = out_dtype_i;
    ctx->saved_data["shift_dtype"] = int64_t(shift_in.scalar_type());
    ctx->saved_data["scale_dtype"] = int64_t(scale_in.scalar_type());
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &scale = saved[1], &mean = saved[2], &rstd = saved[3];
    const auto out_dtype = static_cast<at::ScalarType>(ctx->saved_data["out_dtype"].toInt());
    const auto shift_dtype = static_cast<at::ScalarType>(ctx->saved_data["shift_dtype"].toInt());
    const auto scale_dtype = static_cast<at::ScalarType>(ctx->saved_data["scale_dtype"].toInt());
    if (!grads[0].defined()) return {at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
    const c10::cuda::CUDAGuard guard(x.device());
    const int batch = int(x.size(0)), tokens = int(x.size(1)), cols = int(x.size(2));
    // A broadcast or non-contiguous incoming gradient is made dense once.
    const at::Tensor dy = grads[0].to(out_dtype).contiguous();
    at::Tensor dx = at::empty_like(x);
    at::Tensor dshift = at::empty({batch, cols}, scale.options());
    at::Tensor dscale = at::empty_like(dshift);
    const int tiles = kernels::adaln_layernorm_backward_tiles(
        batch, tokens, at::cuda::getCurrentDeviceProperties()->multiProcessorCount);
    // Shape-determined scratch from the caching allocator: fine under graph capture.
    at::Tensor partials = at::empty({2, batch, tiles, cols}, x.options().dtype(at::kFloat));
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
    if (dshift.scalar_type() != shift_dtype) dshift = dshift.to(shift_dtype);
    if (dscale.scalar_type() != scale_dtype) dscale = dscale.to(scale_dtype);
    return {dx, dshift, dscale, at::Tensor(), at::Tensor()};
  }
};

}  // namespace

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
  check_args(x, shift, scale, out_dtype);
  if (!x.is_cuda()) return adaln_layernorm_reference(x, shift, scale, out_dtype, eps);
  return AdaLNLayerNormFunction::apply(x, shift, scale, int64_t(out_dtype), eps);
}

}  // namespace perftrain::ops
