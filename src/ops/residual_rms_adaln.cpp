#include "ops/residual_rms_adaln.h"

#include <ATen/TensorOperators.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/rsqrt.h>
#include <ATen/ops/tanh.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/csrc/autograd/custom_function.h>

#include <optional>
#include <utility>
#include <vector>

#include "base/error.h"
#include "kernels/residual_rms_adaln.h"
#include "ops/compute_weights.h"
#include "ops/dtype_dispatch.h"
#include "ops/rms_adaln.h"
#include "ops/row_norm_op.h"

namespace perftrain::ops {

namespace {

constexpr const char* kOp = "residual_rms_adaln";

// Autograd functions take no undefined tensors: the optional weights and
// scale travel as optionals, and an absent one has no input edge, so the
// edges of the present tensors are numbered in order (x = 0, gate = 1, y = 2,
// then post_weight, pre_weight, scale where present).
struct ResidualRmsAdaLNFunction : public torch::autograd::Function<ResidualRmsAdaLNFunction> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x_in, const at::Tensor& gate_in,
                               const at::Tensor& y_in, const std::optional<at::Tensor>& post_weight_opt,
                               const std::optional<at::Tensor>& pre_weight_opt,
                               const std::optional<at::Tensor>& scale_opt, int64_t out_dtype_i, double eps,
                               const std::optional<at::Tensor>& fp8_scale, const std::optional<at::Tensor>& fp8_amax) {
    const at::Tensor post_weight_in = post_weight_opt.value_or(at::Tensor());
    const at::Tensor pre_weight_in = pre_weight_opt.value_or(at::Tensor());
    const at::Tensor scale_in = scale_opt.value_or(at::Tensor());
    const Fp8Target target{fp8_scale.value_or(at::Tensor()), fp8_amax.value_or(at::Tensor())};
    const detail::ResidualRmsAdaLNForward f =
        detail::residual_rms_adaln_forward_cuda(x_in, gate_in, y_in, post_weight_in, pre_weight_in, scale_in,
                                                static_cast<at::ScalarType>(out_dtype_i), eps,
                                                fp8_scale ? &target : nullptr);
    // An unused output's gradient arrives undefined rather than as zeros to read.
    ctx->set_materialize_grads(false);
    // Nothing of x is kept (the residual's gradient needs none of it); x1 only
    // without xhat.
    const at::Tensor none;
    ctx->save_for_backward({f.xhat.defined() ? none : f.x1, f.xhat, f.y, f.gate, f.scale, f.post_weight,
                            f.pre_weight, f.y_rstd, f.rstd});
    detail::save_residual_types(ctx, f.act, x_in, y_in, gate_in);
    detail::save_dtypes(ctx, {{"post_weight_dtype", &post_weight_in},
                              {"pre_weight_dtype", &pre_weight_in},
                              {"scale_dtype", &scale_in}});
    if (!f.codes.defined()) return {f.x1, f.h};
    ctx->mark_non_differentiable({f.codes});
    return {f.x1, f.h, f.codes};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    detail::ResidualRmsAdaLNForward s;
    s.x1 = saved[0], s.xhat = saved[1], s.y = saved[2], s.gate = saved[3], s.scale = saved[4];
    s.post_weight = saved[5], s.pre_weight = saved[6], s.y_rstd = saved[7], s.rstd = saved[8];
    s.act = detail::saved_dtype(ctx, "act");
    const auto present = [&](const char* key) {
      return detail::saved_present(ctx, key) ? std::optional<at::ScalarType>(detail::saved_dtype(ctx, key))
                                             : std::nullopt;
    };
    const detail::ResidualRmsAdaLNDtypes dtypes{detail::saved_dtype(ctx, "x_dtype"), detail::saved_dtype(ctx, "gate_dtype"),
                                                detail::saved_dtype(ctx, "y_dtype"), present("post_weight_dtype"),
                                                present("pre_weight_dtype"), present("scale_dtype")};
    const bool has_post = dtypes.post_weight.has_value(), has_pre = dtypes.pre_weight.has_value();
    const int post_edge = 3, pre_edge = 3 + has_post, scale_edge = 3 + has_post + has_pre;
    const detail::ResidualRmsAdaLNWants wants{
        ctx->needs_input_grad(0), ctx->needs_input_grad(1), ctx->needs_input_grad(2),
        has_post && ctx->needs_input_grad(post_edge), has_pre && ctx->needs_input_grad(pre_edge),
        dtypes.scale.has_value() && ctx->needs_input_grad(scale_edge)};
    const detail::ResidualRmsAdaLNGrads g =
        detail::residual_rms_adaln_backward_cuda(grads[0], grads[1], s, dtypes, wants);
    return {g.x, g.gate, g.y, g.post_weight, g.pre_weight, g.scale, at::Tensor(), at::Tensor(), at::Tensor(),
            at::Tensor()};
  }
};

}  // namespace

namespace detail {

void check_residual_rms_adaln_args(const at::Tensor& x, const at::Tensor& gate, const at::Tensor& y,
                                   const at::Tensor& post_weight, const at::Tensor& pre_weight,
                                   const at::Tensor& scale, at::ScalarType out_dtype) {
  check_row_norm_args(kOp, x, {{"y", y}}, {{"gate", gate}}, {{"scale", scale}}, kernels::kResidualRmsAdaLNMaxCols,
                      out_dtype);
  check_norm_weight(kOp, x, post_weight, "post_weight");
  check_norm_weight(kOp, x, pre_weight, "pre_weight");
}

ResidualRmsAdaLNForward residual_rms_adaln_forward_cuda(const at::Tensor& x_in, const at::Tensor& gate_in,
                                                        const at::Tensor& y_in, const at::Tensor& post_weight_in,
                                                        const at::Tensor& pre_weight_in, const at::Tensor& scale_in,
                                                        at::ScalarType out_dtype, double eps, const Fp8Target* fp8) {
  const c10::cuda::CUDAGuard guard(x_in.device());
  // gate and scale share one kernel type; y and h another (t.act).
  const std::vector<at::Tensor> mod = per_sample_rows({gate_in, scale_in});
  const at::Tensor &gate = mod[0], &scale = mod[1];
  // The kernels read the weights as dense fp32 (the masters themselves, no copy, when they are fp32).
  auto dense_f32 = [](const at::Tensor& w) { return w.defined() ? compute_weight(w, at::kFloat) : at::Tensor(); };
  const at::Tensor post_weight = dense_f32(post_weight_in), pre_weight = dense_f32(pre_weight_in);
  // x1's norm backward reads xhat where it is narrower than x1 (the bf16
  // training path), x1 otherwise (see the header).
  RowNormTensors t = row_norm_tensors(x_in, y_in, out_dtype, /*keep_xhat=*/true, /*stat=*/true, fp8);
  const FusedFp8Output q = fused_fp8_output(fp8, t, out_dtype, kOp);
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  with_kernel_types(kOp, t.x.scalar_type(), gate.scalar_type(), t.act, [&](auto tx, auto tm, auto ta) {
    using TX = kernel_type<decltype(tx)>;
    using TM = kernel_type<decltype(tm)>;
    using TA = kernel_type<decltype(ta)>;
    kernels::residual_rms_adaln_forward<TX, TM, TA>(
        kernel_ptr<const TX>(t.x), kernel_ptr<const TM>(gate), gate.stride(0), kernel_ptr<const TA>(t.y),
        kernel_ptr<const float>(post_weight), kernel_ptr<const float>(pre_weight), kernel_ptr<const TM>(scale),
        scale.defined() ? scale.stride(0) : 0, kernel_ptr<TX>(t.x1), q.fused ? nullptr : kernel_ptr<TA>(t.h),
        t.stat.data_ptr<float>(), t.rstd.data_ptr<float>(), kernel_ptr<TA>(t.xhat), t.batch, t.tokens, t.cols,
        float(eps), stream, q.kernel);
  });
  const FinishedFp8Output out = finish_fp8_output(q, fp8, t, out_dtype, kOp);
  ResidualRmsAdaLNForward f;
  f.x1 = t.x1, f.h = out.h, f.codes = out.codes, f.y = t.y, f.gate = gate, f.scale = scale;
  f.post_weight = post_weight, f.pre_weight = pre_weight, f.y_rstd = t.stat, f.rstd = t.rstd, f.xhat = t.xhat;
  f.act = t.act;
  return f;
}

ResidualRmsAdaLNGrads residual_rms_adaln_backward_cuda(const at::Tensor& dx1_in, const at::Tensor& dh_in,
                                                       const ResidualRmsAdaLNForward& saved,
                                                       const ResidualRmsAdaLNDtypes& dtypes,
                                                       const ResidualRmsAdaLNWants& wants) {
  const at::Tensor &x1 = saved.x1, &xhat = saved.xhat, &y = saved.y, &gate = saved.gate, &scale = saved.scale,
                   &post_weight = saved.post_weight, &pre_weight = saved.pre_weight, &y_rstd = saved.y_rstd,
                   &rstd = saved.rstd;
  const at::ScalarType act = saved.act, x_dtype = dtypes.x;
  ResidualRmsAdaLNGrads out;
  if (!dx1_in.defined() && !dh_in.defined()) return out;
  const bool use_h = dh_in.defined();
  const bool want_post = wants.post_weight && dtypes.post_weight.has_value();
  const bool want_pre = use_h && wants.pre_weight && dtypes.pre_weight.has_value();
  const bool want_scale = use_h && wants.scale && dtypes.scale.has_value();
  const c10::cuda::CUDAGuard guard(y.device());
  const int batch = int(y.size(0)), tokens = int(y.size(1)), cols = int(y.size(2));
  const at::TensorOptions f32 = y.options().dtype(at::kFloat);
  const at::Tensor dx1_ext = dense_grad(dx1_in, x_dtype);
  const at::Tensor dh = dense_grad(dh_in, act);
  at::Tensor dx = at::empty(y.sizes(), y.options().dtype(x_dtype)), dy = at::empty_like(y);
  at::Tensor dgate = at::empty({batch, cols}, gate.options());
  at::Tensor dscale = want_scale ? at::empty({batch, cols}, scale.options()) : at::Tensor();
  // The weights' gradients per sample (fp32), summed over the batch below.
  at::Tensor dpost_ps = want_post ? at::empty({batch, cols}, f32) : at::Tensor();
  at::Tensor dpre_ps = want_pre ? at::empty({batch, cols}, f32) : at::Tensor();
  const int tiles = kernels::residual_rms_adaln_backward_tiles(batch, tokens, cols, sm_count());
  const at::Tensor partials = f32_scratch(kernels::residual_rms_adaln_backward_partials(batch, tiles, cols), y);
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  with_kernel_types(kOp, x_dtype, gate.scalar_type(), act, [&](auto tx, auto tm, auto ta) {
    using TX = kernel_type<decltype(tx)>;
    using TM = kernel_type<decltype(tm)>;
    using TA = kernel_type<decltype(ta)>;
    kernels::residual_rms_adaln_backward<TX, TM, TA>(
        kernel_ptr<const TX>(dx1_ext), kernel_ptr<const TA>(dh), kernel_ptr<const TX>(x1), kernel_ptr<const TA>(xhat),
        kernel_ptr<const TA>(y), kernel_ptr<const float>(post_weight), kernel_ptr<const float>(pre_weight),
        kernel_ptr<const TM>(gate), gate.stride(0), kernel_ptr<const TM>(scale), scale.defined() ? scale.stride(0) : 0,
        y_rstd.data_ptr<float>(), kernel_ptr<const float>(rstd), kernel_ptr<TX>(dx), kernel_ptr<TA>(dy),
        kernel_ptr<TM>(dgate), kernel_ptr<TM>(dscale), kernel_ptr<float>(dpost_ps), kernel_ptr<float>(dpre_ps),
        partials.data_ptr<float>(), batch, tokens, cols, tiles, stream);
  });
  // Back to each input's own dtype (no-ops on the fast path).
  if (wants.x) out.x = dx;
  if (wants.gate) out.gate = as_dtype(dgate, dtypes.gate);
  if (wants.y) out.y = as_dtype(dy, dtypes.y);
  if (want_scale) out.scale = as_dtype(dscale, *dtypes.scale);
  std::vector<PerSampleGrad> weight_grads;
  if (want_post) weight_grads.push_back({dpost_ps, *dtypes.post_weight});
  if (want_pre) weight_grads.push_back({dpre_ps, *dtypes.pre_weight});
  std::vector<at::Tensor> sums = batch_sums_on_lane(weight_grads);
  if (want_post) out.post_weight = sums.front();
  if (want_pre) out.pre_weight = sums.back();
  return out;
}

}  // namespace detail

std::pair<at::Tensor, at::Tensor> residual_rms_adaln_reference(const at::Tensor& x, const at::Tensor& gate,
                                                               const at::Tensor& y, const at::Tensor& post_weight,
                                                               const at::Tensor& pre_weight, const at::Tensor& scale,
                                                               at::ScalarType out_dtype, double eps) {
  const bool f64 = x.scalar_type() == at::kDouble || gate.scalar_type() == at::kDouble ||
                   y.scalar_type() == at::kDouble ||
                   (post_weight.defined() && post_weight.scalar_type() == at::kDouble);
  const at::ScalarType ct = f64 ? at::kDouble : at::kFloat;
  const at::Tensor yn = rms_adaln_reference(y, post_weight, at::Tensor(), ct, eps);
  at::Tensor x1 = (x.to(ct) + at::tanh(gate.to(ct)).unsqueeze(1) * yn).to(x.scalar_type());
  at::Tensor h = rms_adaln_reference(x1, pre_weight, scale, out_dtype, eps);
  return {std::move(x1), std::move(h)};
}

std::pair<at::Tensor, at::Tensor> residual_rms_adaln(const at::Tensor& x, const at::Tensor& gate,
                                                     const at::Tensor& y, const at::Tensor& post_weight,
                                                     const at::Tensor& pre_weight, const at::Tensor& scale,
                                                     at::ScalarType out_dtype, double eps) {
  detail::check_residual_rms_adaln_args(x, gate, y, post_weight, pre_weight, scale, out_dtype);
  if (!x.is_cuda()) return residual_rms_adaln_reference(x, gate, y, post_weight, pre_weight, scale, out_dtype, eps);
  variable_list out = ResidualRmsAdaLNFunction::apply(x, gate, y, detail::optional_tensor(post_weight),
                                                      detail::optional_tensor(pre_weight),
                                                      detail::optional_tensor(scale), int64_t(out_dtype), eps,
                                                      std::nullopt, std::nullopt);
  return {std::move(out[0]), std::move(out[1])};
}

std::pair<at::Tensor, Fp8Operand> residual_rms_adaln_fp8(const at::Tensor& x, const at::Tensor& gate,
                                                         const at::Tensor& y, const at::Tensor& post_weight,
                                                         const at::Tensor& pre_weight, const at::Tensor& scale,
                                                         at::ScalarType out_dtype, const Fp8Target& target,
                                                         double eps) {
  detail::check_residual_rms_adaln_args(x, gate, y, post_weight, pre_weight, scale, out_dtype);
  if (!x.is_cuda()) {
    auto [x1, h] = residual_rms_adaln_reference(x, gate, y, post_weight, pre_weight, scale, out_dtype, eps);
    return {std::move(x1), fp8_operand_of(h, target, kOp)};
  }
  variable_list out = ResidualRmsAdaLNFunction::apply(x, gate, y, detail::optional_tensor(post_weight),
                                                      detail::optional_tensor(pre_weight),
                                                      detail::optional_tensor(scale), int64_t(out_dtype), eps,
                                                      target.scale, target.amax);
  return {std::move(out[0]), Fp8Operand{std::move(out[1]), std::move(out[2]), at::Tensor()}};
}

}  // namespace perftrain::ops
