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
#include <string>
#include <utility>
#include <vector>

#include "base/error.h"
#include "kernels/residual_rms_adaln.h"
#include "ops/column_sums.h"
#include "ops/compute_weights.h"
#include "ops/dtype_dispatch.h"
#include "ops/rms_adaln.h"
#include "ops/weight_grad_lane.h"

namespace perftrain::ops {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

namespace {

constexpr const char* kOp = "residual_rms_adaln";

std::optional<at::Tensor> optional_tensor(const at::Tensor& t) {
  return t.defined() ? std::optional<at::Tensor>(t) : std::nullopt;
}

void check_args(const at::Tensor& x, const at::Tensor& gate, const at::Tensor& y, const at::Tensor& post_weight,
                const at::Tensor& pre_weight, const at::Tensor& scale, at::ScalarType out_dtype) {
  if (scale.defined())
    detail::check_row_op_args(kOp, x, {{"y", y}}, {{"gate", gate}, {"scale", scale}},
                              kernels::kResidualRmsAdaLNMaxCols);
  else
    detail::check_row_op_args(kOp, x, {{"y", y}}, {{"gate", gate}}, kernels::kResidualRmsAdaLNMaxCols);
  detail::check_norm_weight(kOp, x, post_weight, "post_weight");
  detail::check_norm_weight(kOp, x, pre_weight, "pre_weight");
  check_kernel_dtype(kOp, out_dtype, "out_dtype");
}

// Autograd functions take no undefined tensors: the optional weights and
// scale travel as optionals, and an absent one has no input edge, so the
// edges of the present tensors are numbered in order (x = 0, gate = 1, y = 2,
// then post_weight, pre_weight, scale where present).
struct ResidualRmsAdaLNFunction : public torch::autograd::Function<ResidualRmsAdaLNFunction> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x_in, const at::Tensor& gate_in,
                               const at::Tensor& y_in, const std::optional<at::Tensor>& post_weight_opt,
                               const std::optional<at::Tensor>& pre_weight_opt,
                               const std::optional<at::Tensor>& scale_opt, int64_t out_dtype_i, double eps) {
    const auto out_dtype = static_cast<at::ScalarType>(out_dtype_i);
    const c10::cuda::CUDAGuard guard(x_in.device());
    const int batch = int(x_in.size(0)), tokens = int(x_in.size(1)), cols = int(x_in.size(2));
    const at::Tensor x = x_in.contiguous();
    // gate and scale share one kernel type; mixed dtypes meet in fp32 (tiny tensors).
    const bool same_mod = !scale_opt.has_value() || scale_opt->scalar_type() == gate_in.scalar_type();
    auto mod = [&](const at::Tensor& t) { return rows_dense(same_mod ? t : t.to(at::kFloat)); };
    const at::Tensor gate = mod(gate_in);
    const at::Tensor scale = scale_opt.has_value() ? mod(*scale_opt) : at::Tensor();
    // y and h share one kernel type too. When y is not in out_dtype both go
    // through fp32, which changes no value: y's upcast is exact and h is
    // rounded once, by the cast below.
    const at::ScalarType act = y_in.scalar_type() == out_dtype ? out_dtype : at::kFloat;
    const at::Tensor y = y_in.to(act).contiguous();
    // The kernels read the weights as dense fp32 (the masters themselves, no copy, when they are fp32).
    const at::Tensor post_weight =
        post_weight_opt.has_value() ? compute_weight(*post_weight_opt, at::kFloat) : at::Tensor();
    const at::Tensor pre_weight =
        pre_weight_opt.has_value() ? compute_weight(*pre_weight_opt, at::kFloat) : at::Tensor();
    at::Tensor x1 = at::empty(x.sizes(), x.options());
    at::Tensor h = at::empty(x.sizes(), x.options().dtype(act));
    at::Tensor y_rstd = at::empty({int64_t(batch) * tokens}, x.options().dtype(at::kFloat));
    at::Tensor rstd = at::empty_like(y_rstd);
    // x1's norm backward reads xhat where it is narrower than x1 (16-bit h,
    // wider x: the bf16 training path), x1 otherwise (see the header).
    const bool keep_xhat = c10::elementSize(act) == 2 && c10::elementSize(x.scalar_type()) > 2;
    at::Tensor xhat = keep_xhat ? at::empty(x.sizes(), x.options().dtype(act)) : at::Tensor();
    const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
    with_kernel_types(kOp, x.scalar_type(), gate.scalar_type(), act, [&](auto tx, auto tm, auto ta) {
      using TX = kernel_type<decltype(tx)>;
      using TM = kernel_type<decltype(tm)>;
      using TA = kernel_type<decltype(ta)>;
      kernels::residual_rms_adaln_forward<TX, TM, TA>(
          kernel_ptr<const TX>(x), kernel_ptr<const TM>(gate), gate.stride(0), kernel_ptr<const TA>(y),
          kernel_ptr<const float>(post_weight), kernel_ptr<const float>(pre_weight), kernel_ptr<const TM>(scale),
          scale.defined() ? scale.stride(0) : 0, kernel_ptr<TX>(x1), kernel_ptr<TA>(h), y_rstd.data_ptr<float>(),
          rstd.data_ptr<float>(), kernel_ptr<TA>(xhat), batch, tokens, cols, float(eps), stream);
    });
    // An unused output's gradient arrives undefined rather than as zeros to read.
    ctx->set_materialize_grads(false);
    // Nothing of x is kept (the residual's gradient needs none of it); x1 only
    // without xhat.
    const at::Tensor none;
    ctx->save_for_backward({keep_xhat ? none : x1, xhat, y, gate, scale, post_weight, pre_weight, y_rstd, rstd});
    ctx->saved_data["x_dtype"] = int64_t(x.scalar_type());
    ctx->saved_data["act"] = int64_t(act);
    ctx->saved_data["y_dtype"] = int64_t(y_in.scalar_type());
    ctx->saved_data["gate_dtype"] = int64_t(gate_in.scalar_type());
    auto dtype_or_none = [](const std::optional<at::Tensor>& t) {
      return t.has_value() ? int64_t(t->scalar_type()) : int64_t(-1);
    };
    ctx->saved_data["post_weight_dtype"] = dtype_or_none(post_weight_opt);
    ctx->saved_data["pre_weight_dtype"] = dtype_or_none(pre_weight_opt);
    ctx->saved_data["scale_dtype"] = dtype_or_none(scale_opt);
    if (act != out_dtype) h = h.to(out_dtype);
    return {x1, h};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor &x1 = saved[0], &xhat = saved[1], &y = saved[2], &gate = saved[3], &scale = saved[4],
                     &post_weight = saved[5], &pre_weight = saved[6], &y_rstd = saved[7], &rstd = saved[8];
    auto dtype = [&](const char* key) { return static_cast<at::ScalarType>(ctx->saved_data[key].toInt()); };
    auto present = [&](const char* key) { return ctx->saved_data[key].toInt() >= 0; };
    const at::ScalarType act = dtype("act"), x_dtype = dtype("x_dtype");
    const bool has_post = present("post_weight_dtype"), has_pre = present("pre_weight_dtype"),
               has_scale = present("scale_dtype");
    const int post_edge = 3, pre_edge = 3 + has_post, scale_edge = 3 + has_post + has_pre;
    const at::Tensor &dx1_in = grads[0], &dh_in = grads[1];
    variable_list out(8);  // x, gate, y, post_weight, pre_weight, scale, out_dtype, eps
    if (!dx1_in.defined() && !dh_in.defined()) return out;
    const bool use_h = dh_in.defined();
    const bool want_post = has_post && ctx->needs_input_grad(post_edge);
    const bool want_pre = use_h && has_pre && ctx->needs_input_grad(pre_edge);
    const bool want_scale = use_h && has_scale && ctx->needs_input_grad(scale_edge);
    const c10::cuda::CUDAGuard guard(y.device());
    const int batch = int(y.size(0)), tokens = int(y.size(1)), cols = int(y.size(2));
    const at::TensorOptions f32 = y.options().dtype(at::kFloat);
    // A broadcast or non-contiguous incoming gradient is made dense once.
    const at::Tensor dx1_ext = dx1_in.defined() ? dx1_in.to(x_dtype).contiguous() : at::Tensor();
    const at::Tensor dh = use_h ? dh_in.to(act).contiguous() : at::Tensor();
    at::Tensor dx = at::empty(y.sizes(), y.options().dtype(x_dtype)), dy = at::empty_like(y);
    at::Tensor dgate = at::empty({batch, cols}, gate.options());
    at::Tensor dscale = want_scale ? at::empty({batch, cols}, scale.options()) : at::Tensor();
    // The weights' gradients per sample (fp32), summed over the batch below.
    at::Tensor dpost_ps = want_post ? at::empty({batch, cols}, f32) : at::Tensor();
    at::Tensor dpre_ps = want_pre ? at::empty({batch, cols}, f32) : at::Tensor();
    const int tiles = kernels::residual_rms_adaln_backward_tiles(
        batch, tokens, cols, at::cuda::getCurrentDeviceProperties()->multiProcessorCount);
    // Shape-determined scratch from the caching allocator: fine under graph capture.
    const at::Tensor partials = at::empty({kernels::residual_rms_adaln_backward_partials(batch, tiles, cols)}, f32);
    const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
    with_kernel_types(kOp, x_dtype, gate.scalar_type(), act, [&](auto tx, auto tm, auto ta) {
      using TX = kernel_type<decltype(tx)>;
      using TM = kernel_type<decltype(tm)>;
      using TA = kernel_type<decltype(ta)>;
      kernels::residual_rms_adaln_backward<TX, TM, TA>(
          kernel_ptr<const TX>(dx1_ext), kernel_ptr<const TA>(dh), kernel_ptr<const TX>(x1),
          kernel_ptr<const TA>(xhat), kernel_ptr<const TA>(y), kernel_ptr<const float>(post_weight),
          kernel_ptr<const float>(pre_weight), kernel_ptr<const TM>(gate), gate.stride(0),
          kernel_ptr<const TM>(scale), scale.defined() ? scale.stride(0) : 0, y_rstd.data_ptr<float>(),
          kernel_ptr<const float>(rstd), kernel_ptr<TX>(dx), kernel_ptr<TA>(dy), kernel_ptr<TM>(dgate),
          kernel_ptr<TM>(dscale), kernel_ptr<float>(dpost_ps), kernel_ptr<float>(dpre_ps),
          partials.data_ptr<float>(), batch, tokens, cols, tiles, stream);
    });
    // Back to each input's own dtype (no-ops on the fast path).
    auto as = [](const at::Tensor& t, at::ScalarType d) { return t.scalar_type() == d ? t : t.to(d); };
    if (ctx->needs_input_grad(0)) out[0] = dx;
    if (ctx->needs_input_grad(1)) out[1] = as(dgate, dtype("gate_dtype"));
    if (ctx->needs_input_grad(2)) out[2] = as(dy, dtype("y_dtype"));
    if (want_scale) out[5] = as(dscale, dtype("scale_dtype"));
    // Over the batch in fp32, then one rounding to each weight's dtype; for
    // the optimizer only, so beside the rest of the backward when a
    // weight-gradient scope is open.
    if (want_post || want_pre) {
      if (want_post) out[3] = at::empty({cols}, f32.dtype(dtype("post_weight_dtype")));
      if (want_pre) out[4] = at::empty({cols}, f32.dtype(dtype("pre_weight_dtype")));
      std::vector<at::Tensor> reads;
      if (want_post) reads.push_back(dpost_ps);
      if (want_pre) reads.push_back(dpre_ps);
      run_weight_grads(
          [&] {
            if (want_post) batch_sums_into(dpost_ps, out[3]);
            if (want_pre) batch_sums_into(dpre_ps, out[4]);
          },
          std::move(reads));
    }
    return out;
  }
};

}  // namespace

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
  check_args(x, gate, y, post_weight, pre_weight, scale, out_dtype);
  if (!x.is_cuda()) return residual_rms_adaln_reference(x, gate, y, post_weight, pre_weight, scale, out_dtype, eps);
  variable_list out = ResidualRmsAdaLNFunction::apply(x, gate, y, optional_tensor(post_weight),
                                                      optional_tensor(pre_weight), optional_tensor(scale),
                                                      int64_t(out_dtype), eps);
  return {std::move(out[0]), std::move(out[1])};
}

}  // namespace perftrain::ops
