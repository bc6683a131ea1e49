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
                               int64_t out_dtype_i, double eps, const std::optional<at::Tensor>& bias_opt,
                               const std::optional<at::Tensor>& fp8_scale, const std::optional<at::Tensor>& fp8_amax) {
    const at::Tensor bias_in = bias_opt.value_or(at::Tensor());
    const Fp8Target target{fp8_scale.value_or(at::Tensor()), fp8_amax.value_or(at::Tensor())};
    detail::ResidualAdaLNForward f =
        detail::residual_adaln_forward_cuda(x_in, gate_in, y_in, shift_in, scale_in, static_cast<at::ScalarType>(out_dtype_i),
                                            eps, bias_in, fp8_scale ? &target : nullptr);
    // An unused output's gradient arrives undefined rather than as zeros to read.
    ctx->set_materialize_grads(false);
    // x1 (or xhat) replaces x: the LN backward needs it, the residual's needs
    // nothing of x. With xhat, x1 and mean are not kept.
    const at::Tensor none;
    const bool kept = f.xhat.defined();
    ctx->save_for_backward({kept ? none : f.x1, f.y, f.gate, f.scale, kept ? none : f.mean, f.rstd, f.bias, f.xhat});
    detail::save_residual_types(ctx, f.act, x_in, y_in, gate_in);
    detail::save_dtypes(ctx, {{"shift_dtype", &shift_in}, {"scale_dtype", &scale_in}, {"bias_dtype", &bias_in}});
    if (!f.codes.defined()) return {f.x1, f.h};
    ctx->mark_non_differentiable({f.codes});
    return {f.x1, f.h, f.codes};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    detail::ResidualAdaLNForward s;
    s.x1 = saved[0], s.y = saved[1], s.gate = saved[2], s.scale = saved[3], s.mean = saved[4], s.rstd = saved[5];
    s.bias = saved[6], s.xhat = saved[7], s.act = detail::saved_dtype(ctx, "act");
    const bool has_bias = detail::saved_present(ctx, "bias_dtype");
    const detail::ResidualAdaLNDtypes dtypes{
        detail::saved_dtype(ctx, "x_dtype"),     detail::saved_dtype(ctx, "gate_dtype"),
        detail::saved_dtype(ctx, "y_dtype"),     detail::saved_dtype(ctx, "shift_dtype"),
        detail::saved_dtype(ctx, "scale_dtype"),
        has_bias ? std::optional<at::ScalarType>(detail::saved_dtype(ctx, "bias_dtype")) : std::nullopt};
    const detail::ResidualAdaLNWants wants{ctx->needs_input_grad(0), ctx->needs_input_grad(1),
                                           ctx->needs_input_grad(2), ctx->needs_input_grad(3),
                                           ctx->needs_input_grad(4), has_bias && ctx->needs_input_grad(5)};
    const detail::ResidualAdaLNGrads g = detail::residual_adaln_backward_cuda(grads[0], grads[1], s, dtypes, wants);
    variable_list out(10);  // x, gate, y, shift, scale, out_dtype, eps, bias, fp8_scale, fp8_amax
    out[0] = g.x, out[1] = g.gate, out[2] = g.y, out[3] = g.shift, out[4] = g.scale, out[7] = g.bias;
    return out;
  }
};

}  // namespace

namespace detail {

void check_residual_adaln_args(const at::Tensor& x, const at::Tensor& gate, const at::Tensor& y,
                               const at::Tensor& shift, const at::Tensor& scale, at::ScalarType out_dtype,
                               const at::Tensor& bias) {
  check_row_norm_args(kOp, x, {{"y", y}}, {{"gate", gate}, {"shift", shift}, {"scale", scale}}, {},
                      kernels::kResidualAdaLNMaxCols, out_dtype);
  check_residual_bias(kOp, x, bias);
}

ResidualAdaLNForward residual_adaln_forward_cuda(const at::Tensor& x_in, const at::Tensor& gate_in,
                                                 const at::Tensor& y_in, const at::Tensor& shift_in,
                                                 const at::Tensor& scale_in, at::ScalarType out_dtype, double eps,
                                                 const at::Tensor& bias_in, const Fp8Target* fp8) {
  const c10::cuda::CUDAGuard guard(x_in.device());
  // gate, shift and scale share one kernel type; y and h another (t.act).
  const std::vector<at::Tensor> mod = per_sample_rows({gate_in, shift_in, scale_in});
  const at::Tensor &gate = mod[0], &shift = mod[1], &scale = mod[2];
  // The kernels read the bias as dense fp32 (no copy when it already is).
  const at::Tensor bias = bias_in.defined() ? bias_in.to(at::kFloat).contiguous() : at::Tensor();
  // The LN backward reads xhat where it is narrower than x1 (the bf16 DiT
  // path), x1 and mean otherwise (see the header).
  RowNormTensors t = row_norm_tensors(x_in, y_in, out_dtype, /*keep_xhat=*/true, /*stat=*/true, fp8);
  const FusedFp8Output q = fused_fp8_output(fp8, t, out_dtype, kOp);
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  with_kernel_types(kOp, t.x.scalar_type(), gate.scalar_type(), t.act, [&](auto tx, auto tm, auto ta) {
    using TX = kernel_type<decltype(tx)>;
    using TM = kernel_type<decltype(tm)>;
    using TA = kernel_type<decltype(ta)>;
    kernels::residual_adaln_forward<TX, TM, TA>(
        kernel_ptr<const TX>(t.x), kernel_ptr<const TM>(gate), gate.stride(0), kernel_ptr<const TA>(t.y),
        kernel_ptr<const float>(bias), kernel_ptr<const TM>(shift), shift.stride(0), kernel_ptr<const TM>(scale),
        scale.stride(0), kernel_ptr<TX>(t.x1), q.fused ? nullptr : kernel_ptr<TA>(t.h), t.stat.data_ptr<float>(),
        t.rstd.data_ptr<float>(), kernel_ptr<TA>(t.xhat), t.batch, t.tokens, t.cols, float(eps), stream, q.kernel);
  });
  const FinishedFp8Output out = finish_fp8_output(q, fp8, t, out_dtype, kOp);
  ResidualAdaLNForward f;
  f.x1 = t.x1, f.h = out.h, f.codes = out.codes, f.y = t.y, f.gate = gate, f.scale = scale, f.bias = bias;
  f.mean = t.stat, f.rstd = t.rstd, f.xhat = t.xhat, f.act = t.act;
  return f;
}

ResidualAdaLNGrads residual_adaln_backward_cuda(const at::Tensor& dx1_in, const at::Tensor& dh_in,
                                                const ResidualAdaLNForward& saved, const ResidualAdaLNDtypes& dtypes,
                                                const ResidualAdaLNWants& wants) {
  const at::Tensor &x1 = saved.x1, &y = saved.y, &gate = saved.gate, &scale = saved.scale, &mean = saved.mean,
                   &rstd = saved.rstd, &bias = saved.bias, &xhat = saved.xhat;
  const at::ScalarType act = saved.act, x_dtype = dtypes.x;
  const at::TensorOptions x_options = y.options().dtype(x_dtype);
  const bool want_bias = wants.bias && dtypes.bias.has_value();
  ResidualAdaLNGrads out;
  if (!dx1_in.defined() && !dh_in.defined()) return out;
  const c10::cuda::CUDAGuard guard(y.device());
  const int batch = int(y.size(0)), tokens = int(y.size(1)), cols = int(y.size(2));
  const int sms = sm_count();
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  const at::Tensor dx1_ext = dense_grad(dx1_in, x_dtype);
  at::Tensor dx, dy = at::empty_like(y);
  at::Tensor dgate = at::empty({batch, cols}, gate.options()), dshift, dscale;
  // The bias's gradient per sample (fp32), summed over the batch below.
  at::Tensor dbias_ps = want_bias ? at::empty({batch, cols}, x_options.dtype(at::kFloat)) : at::Tensor();
  float* dbias_ptr = kernel_ptr<float>(dbias_ps);
  // The bias enters dgate only; without a wanted dgate the kernels may leave it out.
  const float* bias_ptr = wants.gate && bias.defined() ? bias.data_ptr<float>() : nullptr;
  const bool bias_sums = bias_ptr != nullptr || want_bias;
  // Only x1 was used: exactly gated_residual's backward, and dx is the
  // incoming gradient itself. Otherwise the fused backward.
  const bool x1_only = !dh_in.defined();
  const at::Tensor dh = dense_grad(dh_in, act);
  if (x1_only) {
    dx = dx1_in;
  } else {
    dx = at::empty(y.sizes(), x_options);
    dshift = at::empty_like(dgate);
    dscale = at::empty_like(dgate);
  }
  if (!x1_only || wants.gate || wants.y || want_bias) {
    const int tiles = x1_only ? kernels::gated_residual_backward_tiles(batch, tokens, sms)
                              : kernels::residual_adaln_backward_tiles(batch, tokens, cols, bias_sums, sms);
    const at::Tensor partials =
        f32_scratch(x1_only ? kernels::gated_residual_backward_partials(batch, tiles, cols, bias_sums)
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
  if (wants.x) out.x = dx;
  if (wants.gate) out.gate = as_dtype(dgate, dtypes.gate);
  if (wants.y) out.y = as_dtype(dy, dtypes.y);
  if (wants.shift && dshift.defined()) out.shift = as_dtype(dshift, dtypes.shift);
  if (wants.scale && dscale.defined()) out.scale = as_dtype(dscale, dtypes.scale);
  if (want_bias) out.bias = batch_sums_on_lane({{dbias_ps, *dtypes.bias}})[0];
  return out;
}

}  // namespace detail

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
  detail::check_residual_adaln_args(x, gate, y, shift, scale, out_dtype, bias);
  if (!x.is_cuda()) return residual_adaln_reference(x, gate, y, shift, scale, out_dtype, eps, bias);
  variable_list out = ResidualAdaLNFunction::apply(x, gate, y, shift, scale, int64_t(out_dtype), eps,
                                                   detail::optional_tensor(bias), std::nullopt, std::nullopt);
  return {std::move(out[0]), std::move(out[1])};
}

std::pair<at::Tensor, Fp8Operand> residual_adaln_fp8(const at::Tensor& x, const at::Tensor& gate,
                                                     const at::Tensor& y, const at::Tensor& shift,
                                                     const at::Tensor& scale, at::ScalarType out_dtype,
                                                     const Fp8Target& target, double eps, const at::Tensor& bias) {
  detail::check_residual_adaln_args(x, gate, y, shift, scale, out_dtype, bias);
  if (!x.is_cuda()) {
    auto [x1, h] = residual_adaln_reference(x, gate, y, shift, scale, out_dtype, eps, bias);
    return {std::move(x1), fp8_operand_of(h, target, kOp)};
  }
  variable_list out = ResidualAdaLNFunction::apply(x, gate, y, shift, scale, int64_t(out_dtype), eps,
                                                   detail::optional_tensor(bias), target.scale, target.amax);
  return {std::move(out[0]), Fp8Operand{std::move(out[1]), std::move(out[2]), at::Tensor()}};
}

}  // namespace perftrain::ops
