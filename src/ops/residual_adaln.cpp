#include "ops/residual_adaln.h"

#include <ATen/TensorOperators.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/csrc/autograd/custom_function.h>

#include <optional>
#include <string>

#include "base/error.h"
#include "kernels/gated_residual.h"
#include "kernels/residual_adaln.h"
#include "ops/adaln_layernorm.h"
#include "ops/column_sums.h"
#include "ops/dtype_dispatch.h"
#include "ops/gated_residual.h"
#include "ops/weight_grad_lane.h"

namespace perftrain::ops {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

namespace {

constexpr const char* kOp = "residual_adaln";

void check_args(const at::Tensor& x, const at::Tensor& gate, const at::Tensor& y, const at::Tensor& shift,
                const at::Tensor& scale, at::ScalarType out_dtype) {
  detail::check_row_op_args(kOp, x, {{"y", y}}, {{"gate", gate}, {"shift", shift}, {"scale", scale}},
                            kernels::kResidualAdaLNMaxCols);
  check_kernel_dtype(kOp, out_dtype, "out_dtype");
}

// The bias travels as an optional: autograd functions take no undefined
// tensors, but an absent optional is "no input here" (and has no gradient slot
// among the input edges: needs_input_grad(5) exists only when it is present).
struct ResidualAdaLNFunction : public torch::autograd::Function<ResidualAdaLNFunction> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x_in, const at::Tensor& gate_in,
                               const at::Tensor& y_in, const at::Tensor& shift_in, const at::Tensor& scale_in,
                               int64_t out_dtype_i, double eps, const std::optional<at::Tensor>& bias_opt) {
    const auto out_dtype = static_cast<at::ScalarType>(out_dtype_i);
    const c10::cuda::CUDAGuard guard(x_in.device());
    const int batch = int(x_in.size(0)), tokens = int(x_in.size(1)), cols = int(x_in.size(2));
    const at::Tensor x = x_in.contiguous();
    // gate, shift and scale share one kernel type; mixed dtypes meet in fp32 (tiny tensors).
    const bool same_mod =
        gate_in.scalar_type() == shift_in.scalar_type() && gate_in.scalar_type() == scale_in.scalar_type();
    auto mod = [&](const at::Tensor& t) { return rows_dense(same_mod ? t : t.to(at::kFloat)); };
    const at::Tensor gate = mod(gate_in), shift = mod(shift_in), scale = mod(scale_in);
    // y and h share one kernel type too. When y is not in out_dtype both go
    // through fp32, which changes no value: y's upcast is exact and h is
    // rounded once, by the cast below.
    const at::ScalarType act = y_in.scalar_type() == out_dtype ? out_dtype : at::kFloat;
    const at::Tensor y = y_in.to(act).contiguous();
    // The kernels read the bias as dense fp32 (no copy when it already is).
    const at::Tensor bias = bias_opt.has_value() ? bias_opt->to(at::kFloat).contiguous() : at::Tensor();
    at::Tensor x1 = at::empty(x.sizes(), x.options());
    at::Tensor h = at::empty(x.sizes(), x.options().dtype(act));
    at::Tensor mean = at::empty({int64_t(batch) * tokens}, x.options().dtype(at::kFloat));
    at::Tensor rstd = at::empty_like(mean);
    // The LN backward reads xhat where it is narrower than x1 (16-bit h, wider
    // x: the bf16 DiT path), x1 and mean otherwise (see the header).
    const bool keep_xhat = c10::elementSize(act) == 2 && c10::elementSize(x.scalar_type()) > 2;
    at::Tensor xhat = keep_xhat ? at::empty(x.sizes(), x.options().dtype(act)) : at::Tensor();
    const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
    with_kernel_types(kOp, x.scalar_type(), gate.scalar_type(), act, [&](auto tx, auto tm, auto ta) {
      using TX = kernel_type<decltype(tx)>;
      using TM = kernel_type<decltype(tm)>;
      using TA = kernel_type<decltype(ta)>;
      kernels::residual_adaln_forward<TX, TM, TA>(
          kernel_ptr<const TX>(x), kernel_ptr<const TM>(gate), gate.stride(0), kernel_ptr<const TA>(y),
          kernel_ptr<const float>(bias), kernel_ptr<const TM>(shift), shift.stride(0), kernel_ptr<const TM>(scale),
          scale.stride(0), kernel_ptr<TX>(x1), kernel_ptr<TA>(h), mean.data_ptr<float>(), rstd.data_ptr<float>(),
          kernel_ptr<TA>(xhat), batch, tokens, cols, float(eps), stream);
    });
    // An unused output's gradient arrives undefined rather than as zeros to read.
    ctx->set_materialize_grads(false);
    // x1 (or xhat) replaces x: the LN backward needs it, the residual's needs
    // nothing of x. With xhat, x1 and mean are not kept.
    const at::Tensor none;
    ctx->save_for_backward({keep_xhat ? none : x1, y, gate, scale, keep_xhat ? none : mean, rstd, bias, xhat});
    ctx->saved_data["x_dtype"] = int64_t(x.scalar_type());
    ctx->saved_data["act"] = int64_t(act);
    ctx->saved_data["y_dtype"] = int64_t(y_in.scalar_type());
    ctx->saved_data["gate_dtype"] = int64_t(gate_in.scalar_type());
    ctx->saved_data["shift_dtype"] = int64_t(shift_in.scalar_type());
    ctx->saved_data["scale_dtype"] = int64_t(scale_in.scalar_type());
    ctx->saved_data["bias_dtype"] = bias_opt.has_value() ? int64_t(bias_opt->scalar_type()) : int64_t(-1);
    if (act != out_dtype) h = h.to(out_dtype);
    return {x1, h};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor &x1 = saved[0], &y = saved[1], &gate = saved[2], &scale = saved[3], &mean = saved[4],
                     &rstd = saved[5], &bias = saved[6], &xhat = saved[7];
    auto dtype = [&](const char* key) { return static_cast<at::ScalarType>(ctx->saved_data[key].toInt()); };
    const at::ScalarType act = dtype("act"), x_dtype = dtype("x_dtype");
    const at::TensorOptions x_options = y.options().dtype(x_dtype);
    const at::Tensor &dx1_in = grads[0], &dh_in = grads[1];
    const int64_t bias_dtype = ctx->saved_data["bias_dtype"].toInt();
    const bool want_x = ctx->needs_input_grad(0), want_gate = ctx->needs_input_grad(1),
               want_y = ctx->needs_input_grad(2), want_shift = ctx->needs_input_grad(3),
               want_scale = ctx->needs_input_grad(4), want_bias = bias_dtype >= 0 && ctx->needs_input_grad(5);
    variable_list out(8);  // x, gate, y, shift, scale, out_dtype, eps, bias
    if (!dx1_in.defined() && !dh_in.defined()) return out;
    const c10::cuda::CUDAGuard guard(y.device());
    const int batch = int(y.size(0)), tokens = int(y.size(1)), cols = int(y.size(2));
    const int sms = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
    const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
    // A broadcast or non-contiguous incoming gradient is made dense once.
    const at::Tensor dx1_ext = dx1_in.defined() ? dx1_in.to(x_dtype).contiguous() : at::Tensor();
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
    const at::Tensor dh = x1_only ? at::Tensor() : dh_in.to(act).contiguous();
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
      // Shape-determined scratch from the caching allocator: fine under graph capture.
      const at::Tensor partials =
          at::empty({x1_only ? kernels::gated_residual_backward_partials(batch, tiles, cols, bias_sums)
                             : kernels::residual_adaln_backward_partials(batch, tiles, cols, bias_sums)},
                    x_options.dtype(at::kFloat));
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
    auto as = [](const at::Tensor& t, at::ScalarType d) { return t.scalar_type() == d ? t : t.to(d); };
    if (want_x) out[0] = dx;
    if (want_gate) out[1] = as(dgate, dtype("gate_dtype"));
    if (want_y) out[2] = as(dy, dtype("y_dtype"));
    if (want_shift && dshift.defined()) out[3] = as(dshift, dtype("shift_dtype"));
    if (want_scale && dscale.defined()) out[4] = as(dscale, dtype("scale_dtype"));
    // Over the batch in fp32, then (for a non-fp32 bias) one rounding to its dtype.
    // The bias gradient is for the optimizer only: its batch sum runs beside
    // the rest of the backward when a weight-gradient scope is open.
    if (want_bias) {
      out[7] = at::empty({cols}, x_options.dtype(static_cast<at::ScalarType>(bias_dtype)));
      run_weight_grads([&] { batch_sums_into(dbias_ps, out[7]); }, {dbias_ps});
    }
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
  check_args(x, gate, y, shift, scale, out_dtype);
  detail::check_residual_bias(kOp, x, bias);
  if (!x.is_cuda()) return residual_adaln_reference(x, gate, y, shift, scale, out_dtype, eps, bias);
  const std::optional<at::Tensor> bias_opt = bias.defined() ? std::optional<at::Tensor>(bias) : std::nullopt;
  variable_list out = ResidualAdaLNFunction::apply(x, gate, y, shift, scale, int64_t(out_dtype), eps, bias_opt);
  return {std::move(out[0]), std::move(out[1])};
}

}  // namespace perftrain::ops
