#include "ops/residual_adaln.h"

#include <ATen/TensorOperators.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/csrc/autograd/custom_function.h>

#include <optional>
#include <vector>

#include "base/error.h"
#include "kernels/gated_residual.h"
#include "kernels/residual_adaln.h"
#include "ops/adaln_layernorm.h"
#include "ops/dtype_dispatch.h"
#include "ops/gated_residual.h"
#include "ops/row_norm_op.h"

namespace perftrain::ops {

namespace {

constexpr const char* kOp = "residual_adaln";

// The bias travels as an optional: autograd functions take no undefined
// tensors, but an absent optional is "no input here" (and has no gradient slot
// among the input edges: needs_input_grad(5) exists only when it is present).
struct ResidualAdaLNFunction : public torch::autograd::Function<ResidualAdaLNFunction> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x_in, const at::Tensor& gate_in,
                               const at::Tensor& y_in, const at::Tensor& shift_in, const at::Tensor& scale_in,
                               int64_t out_dtype_i, double eps, const std::optional<at::Tensor>& bias_opt) {
    const auto out_dtype = static_cast<at::ScalarType>(out_dtype_i);
    const c10::cuda::CUDAGuard guard(x_in.device());
    // gate, shift and scale share one kernel type; y and h another (t.act).
    const std::vector<at::Tensor> mod = detail::per_sample_rows({gate_in, shift_in, scale_in});
    const at::Tensor &gate = mod[0], &shift = mod[1], &scale = mod[2];
    // The kernels read the bias as dense fp32 (no copy when it already is).
    const at::Tensor bias_in = bias_opt.value_or(at::Tensor());
    const at::Tensor bias = bias_in.defined() ? bias_in.to(at::kFloat).contiguous() : at::Tensor();
    // The LN backward reads xhat where it is narrower than x1 (the bf16 DiT
    // path), x1 and mean otherwise (see the header).
    detail::RowNormTensors t = detail::row_norm_tensors(x_in, y_in, out_dtype, /*keep_xhat=*/true, /*stat=*/true);
    const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
    with_kernel_types(kOp, t.x.scalar_type(), gate.scalar_type(), t.act, [&](auto tx, auto tm, auto ta) {
      using TX = kernel_type<decltype(tx)>;
      using TM = kernel_type<decltype(tm)>;
      using TA = kernel_type<decltype(ta)>;
      kernels::residual_adaln_forward<TX, TM, TA>(
          kernel_ptr<const TX>(t.x), kernel_ptr<const TM>(gate), gate.stride(0), kernel_ptr<const TA>(t.y),
          kernel_ptr<const float>(bias), kernel_ptr<const TM>(shift), shift.stride(0), kernel_ptr<const TM>(scale),
          scale.stride(0), kernel_ptr<TX>(t.x1), kernel_ptr<TA>(t.h), t.stat.data_ptr<float>(),
          t.rstd.data_ptr<float>(), kernel_ptr<TA>(t.xhat), t.batch, t.tokens, t.cols, float(eps), stream);
    });
    // An unused output's gradient arrives undefined rather than as zeros to read.
    ctx->set_materialize_grads(false);
    // x1 (or xhat) replaces x: the LN backward needs it, the residual's needs
    // nothing of x. With xhat, x1 and mean are not kept.
    const at::Tensor none;
    const bool kept = t.xhat.defined();
    ctx->save_for_backward({kept ? none : t.x1, t.y, gate, scale, kept ? none : t.stat, t.rstd, bias, t.xhat});
    detail::save_residual_types(ctx, t, y_in, gate_in);
    detail::save_dtypes(ctx, {{"shift_dtype", &shift_in}, {"scale_dtype", &scale_in}, {"bias_dtype", &bias_in}});
    return {t.x1, detail::as_dtype(t.h, out_dtype)};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor &x1 = saved[0], &y = saved[1], &gate = saved[2], &scale = saved[3], &mean = saved[4],
                     &rstd = saved[5], &bias = saved[6], &xhat = saved[7];
    const at::ScalarType act = detail::saved_dtype(ctx, "act"), x_dtype = detail::saved_dtype(ctx, "x_dtype");
    const at::TensorOptions x_options = y.options().dtype(x_dtype);
    const at::Tensor &dx1_in = grads[0], &dh_in = grads[1];
    const bool want_x = ctx->needs_input_grad(0), want_gate = ctx->needs_input_grad(1),
               want_y = ctx->needs_input_grad(2), want_shift = ctx->needs_input_grad(3),
               want_scale = ctx->needs_input_grad(4),
               want_bias = detail::saved_present(ctx, "bias_dtype") && ctx->needs_input_grad(5);
    variable_list out(8);  // x, gate, y, shift, scale, out_dtype, eps, bias
    if (!dx1_in.defined() && !dh_in.defined()) return out;
    const c10::cuda::CUDAGuard guard(y.device());
    const int batch = int(y.size(0)), tokens = int(y.size(1)), cols = int(y.size(2));
    const int sms = detail::sm_count();
    const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
    const at::Tensor dx1_ext = detail::dense_grad(dx1_in, x_dtype);
    at::Tensor dx, dy = at::empty_like(y);
    at::Tensor dgate = at::empty({batch, cols}, gate.options()), dshift, dscale;
    // The bias's gradient per sample (fp32), summed over the batch below.
    at::Tensor dbias_ps = want_bias ? at::empty({batch, cols}, x_options.dtype(at::kFloat)) : at::Tensor();
    float* dbias_ptr = kernel_ptr<float>(dbias_ps);
    // The bias enters dgate only; without a wanted dgate the kernels may leave it out.
    const float* bias_ptr = want_gate && bias.defined() ? bias.data_ptr<float>() : nullptr;
    const bool bias_sums = bias_ptr != nullptr || want_bias;
    // Only x1 was used: exactly gated_residual's backward, and dx is the
    // incoming gradient itself. Otherwise the fused backward.
    const bool x1_only = !dh_in.defined();
    const at::Tensor dh = detail::dense_grad(dh_in, act);
    if (x1_only) {
      dx = dx1_in;
    } else {
      dx = at::empty(y.sizes(), x_options);
      dshift = at::empty_like(dgate);
      dscale = at::empty_like(dgate);
    }
    if (!x1_only || want_gate || want_y || want_bias) {
      const int tiles = x1_only ? kernels::gated_residual_backward_tiles(batch, tokens, sms)
                                : kernels::residual_adaln_backward_tiles(batch, tokens, cols, bias_sums, sms);
      const at::Tensor partials =
          detail::f32_scratch(x1_only ? kernels::gated_residual_backward_partials(batch, tiles, cols, bias_sums)
                                      : kernels::residual_adaln_backward_partials(batch, tiles, cols, bias_sums),
                              y);
      with_kernel_types(kOp, x_dtype, gate.scalar_type(), act, [&](auto tx, auto tm, auto ta) {
        using TX = kernel_type<decltype(tx)>;
        using TM = kernel_type<decltype(tm)>;
        using TA = kernel_type<decltype(ta)>;
        if (x1_only)
          kernels::gated_residual_backward<TX, TM, TA>(
              kernel_ptr<const TX>(dx1_ext), kernel_ptr<const TM>(gate), gate.stride(0), kernel_ptr<const TA>(y),
              bias_ptr, kernel_ptr<TA>(dy), kernel_ptr<TM>(dgate), dbias_ptr, partials.data_ptr<float>(), batch,
              tokens, cols, tiles, stream);
        else
          kernels::residual_adaln_backward<TX, TM, TA>(
              kernel_ptr<const TX>(dx1_ext), kernel_ptr<const TA>(dh), kernel_ptr<const TX>(x1),
              kernel_ptr<const TA>(xhat), kernel_ptr<const TA>(y), bias_ptr, kernel_ptr<const TM>(gate),
              gate.stride(0), kernel_ptr<const TM>(scale), scale.stride(0), kernel_ptr<const float>(mean),
              rstd.data_ptr<float>(), kernel_ptr<TX>(dx), kernel_ptr<TA>(dy), kernel_ptr<TM>(dgate),
              kernel_ptr<TM>(dshift), kernel_ptr<TM>(dscale), dbias_ptr, partials.data_ptr<float>(), batch, tokens,
              cols, tiles, stream);
      });
    }
    // Back to each input's own dtype (no-ops on the fast path).
    auto as_input = [&](const at::Tensor& g, const char* key) {
      return detail::as_dtype(g, detail::saved_dtype(ctx, key));
    };
    if (want_x) out[0] = dx;
    if (want_gate) out[1] = as_input(dgate, "gate_dtype");
    if (want_y) out[2] = as_input(dy, "y_dtype");
    if (want_shift && dshift.defined()) out[3] = as_input(dshift, "shift_dtype");
    if (want_scale && dscale.defined()) out[4] = as_input(dscale, "scale_dtype");
    if (want_bias) out[7] = detail::batch_sums_on_lane({{dbias_ps, detail::saved_dtype(ctx, "bias_dtype")}})[0];
    return out;
  }
};

}  // namespace

std::pair<at::Tensor, at::Tensor> residual_adaln_reference(const at::Tensor& x, const at::Tensor& gate,
                                                           const at::Tensor& y, const at::Tensor& shift,
                                                           const at::Tensor& scale, at::ScalarType out_dtype,
                                                           double eps, const at::Tensor& bias) {
  at::Tensor x1 = gated_residual_reference(x, gate, y, bias);
  at::Tensor h = adaln_layernorm_reference(x1, shift, scale, out_dtype, eps);
  return {std::move(x1), std::move(h)};
}

std::pair<at::Tensor, at::Tensor> residual_adaln(const at::Tensor& x, const at::Tensor& gate, const at::Tensor& y,
                                                 const at::Tensor& shift, const at::Tensor& scale,
                                                 at::ScalarType out_dtype, double eps, const at::Tensor& bias) {
  detail::check_row_norm_args(kOp, x, {{"y", y}}, {{"gate", gate}, {"shift", shift}, {"scale", scale}}, {},
                              kernels::kResidualAdaLNMaxCols, out_dtype);
  detail::check_residual_bias(kOp, x, bias);
  if (!x.is_cuda()) return residual_adaln_reference(x, gate, y, shift, scale, out_dtype, eps, bias);
  variable_list out = ResidualAdaLNFunction::apply(x, gate, y, shift, scale, int64_t(out_dtype), eps,
                                                   detail::optional_tensor(bias));
  return {std::move(out[0]), std::move(out[1])};
}

}  // namespace perftrain::ops
