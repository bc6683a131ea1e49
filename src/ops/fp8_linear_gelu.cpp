#include "ops/fp8_linear_gelu.h"

#include <ATen/ops/empty.h>
#include <ATen/ops/gelu.h>
#include <ATen/core/grad_mode.h>
#include <c10/core/DeviceGuard.h>
#include <torch/csrc/autograd/custom_function.h>

#include <optional>
#include <string>
#include <vector>

#include "base/error.h"
#include "kernels/fp8_cast.h"
#include "ops/column_sums.h"
#include "ops/fp8_linear.h"
#include "ops/fp8_linear_parts.h"
#include "ops/linear.h"

namespace perftrain::ops {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

constexpr const char* kOp = "fp8_linear_gelu";

// Inputs: x, weight, bias, fc1's amax, scale, scale_inv, x's codes and
// transposed codes (where its producer wrote them), the consumer's x scale
// and amax. Outputs: act's stand-in (differentiable), its codes and
// transposed codes (not).
struct Fp8LinearGeluFunction : torch::autograd::Function<Fp8LinearGeluFunction> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                               const std::optional<at::Tensor>& bias_opt, const at::Tensor& amax,
                               const at::Tensor& scale, const at::Tensor& scale_inv,
                               const std::optional<at::Tensor>& x_codes, const std::optional<at::Tensor>& x_codes_t,
                               const at::Tensor& act_scale, const at::Tensor& act_amax) {
    const at::Tensor bias = bias_opt.value_or(at::Tensor());
    const c10::DeviceGuard guard(x.device());
    const int64_t m = detail::leading_rows(x), n = weight.size(0);
    // pre = fc1's product + b, kept for GELU's backward.
    const detail::Fp8Product p = detail::fp8_forward_product(x, weight, bias, x_codes, x_codes_t, scale, amax,
                                                             scale_inv, x.requires_grad(), weight.requires_grad());
    const at::Tensor& pre = p.y;
    const auto codes_options = x.options().dtype(at::kFloat8_e4m3fn);
    at::Tensor codes = at::empty({m, n}, codes_options), codes_t = at::empty({n, m}, codes_options);
    detail::fp8_cast_transpose_prologue(pre, at::Tensor(), m, n, kernels::Fp8Prologue::kGeluTanh, Fp8Format::kE4M3,
                                        act_scale, act_amax, codes, codes_t, at::Tensor());
    ctx->save_for_backward({p.xq.q_t, p.wq.q_t, pre});
    ctx->saved_data["amax"] = amax;
    ctx->saved_data["scale"] = scale;
    ctx->saved_data["scale_inv"] = scale_inv;
    detail::save_linear_shapes(ctx, x, weight, bias);
    // The codes take no gradient: it arrives undefined, not as an fp8 zero fill each step.
    ctx->set_materialize_grads(false);
    ctx->mark_non_differentiable({codes, codes_t});
    return {detail::fp8_stand_in_for(x, n), codes, codes_t};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor &xq_t = saved[0], &wq_t = saved[1], &pre = saved[2];
    const at::Tensor amax = ctx->saved_data["amax"].toTensor(), scale = ctx->saved_data["scale"].toTensor(),
                     scale_inv = ctx->saved_data["scale_inv"].toTensor();
    const detail::LinearShapes s = detail::saved_linear_shapes(ctx);
    // Positions: x, weight, bias, amax, scale, scale_inv, x_codes, x_codes_t, act_scale, act_amax.
    variable_list out(10);
    if (!grads[0].defined()) return out;
    const c10::DeviceGuard guard(pre.device());
    const int64_t m = s.m, n = s.n, k = s.x_sizes.back();
    const at::Tensor dact = grads[0].to(pre.scalar_type()).contiguous().view({m, n});
    const bool need_dx = ctx->needs_input_grad(0), need_dw = ctx->needs_input_grad(1),
               need_db = s.b_dtype && ctx->needs_input_grad(2);
    const auto codes_options = pre.options().dtype(fp8_dtype(Fp8Format::kE5M2));
    const at::Tensor dq = at::empty({m, n}, codes_options), dq_t = at::empty({n, m}, codes_options);
    const at::Tensor partials =
        need_db ? at::empty({kernels::fp8_cast_partial_rows(m), n}, pre.options().dtype(at::kFloat)) : at::Tensor();
    detail::fp8_cast_transpose_prologue(dact, pre, m, n, kernels::Fp8Prologue::kGeluTanhBackward, Fp8Format::kE5M2,
                                        scale.select(0, kFp8Dy), amax.select(0, kFp8Dy), dq, dq_t, partials);
    if (need_dx) {
      out[0] = at::empty(s.x_sizes, dact.options());
      detail::fp8_linear_dx(dq, wq_t, scale_inv, out[0].view({m, k}));
    }
    if (need_dw) out[1] = detail::fp8_linear_dw(dq_t, xq_t, scale_inv, s.w_dtype);
    if (need_db) {
      out[2] = at::empty({n}, dact.options().dtype(*s.b_dtype));
      batch_sums_into(partials, out[2]);
    }
    return out;
  }
};

// Under no-grad (sampling): the product and act's codes from one row pass
// over pre, no transposes (a consumer that ever takes dW makes its own, as
// for any producer that wrote none) and nothing saved: 2 bytes an element of
// act read and 1 written.
Fp8Operand fp8_linear_gelu_no_grad(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                                   const std::optional<at::Tensor>& x_codes, const Fp8Scaling& state,
                                   const Fp8Target& act_target) {
  const c10::DeviceGuard guard(x.device());
  const int64_t m = detail::leading_rows(x), n = weight.size(0);
  const detail::Fp8Product p = detail::fp8_forward_product(x, weight, bias, x_codes, std::nullopt, state.scale,
                                                           state.amax, state.scale_inv, false, false);
  const at::Tensor codes = at::empty({m, n}, x.options().dtype(at::kFloat8_e4m3fn));
  detail::fp8_cast_activation(p.y, m, n, kernels::Fp8Prologue::kGeluTanh, Fp8Format::kE4M3, act_target.scale,
                              act_target.amax, codes);
  return {detail::fp8_stand_in_for(x, n), codes, at::Tensor()};
}

}  // namespace

bool fp8_linear_gelu_supported(const at::Tensor& x, int64_t n, int64_t next_n) {
  return fp8_linear_supported(x, n) && (!x.is_cuda() || next_n % 16 == 0);
}

Fp8Operand fp8_linear_gelu_reference(const Fp8Operand& x, const at::Tensor& weight, const at::Tensor& bias,
                                     const Fp8Scaling& state, const Fp8Target& act_target) {
  return fp8_operand_of(at::gelu(fp8_linear(x, weight, bias, state), "tanh"), act_target, kOp);
}

Fp8Operand fp8_linear_gelu(const Fp8Operand& x, const at::Tensor& weight, const at::Tensor& bias,
                           const Fp8Scaling& state, const Fp8Target& act_target) {
  detail::check_fp8_linear_args(x.x, weight, bias, state);
  check_fp8_target(act_target, x.x, kOp);
  if (!x.x.is_cuda() || x.x.scalar_type() != at::kBFloat16)
    return fp8_linear_gelu_reference(x, weight, bias, state, act_target);
  const std::optional<at::Tensor> codes =
      x.codes.defined() ? std::optional<at::Tensor>(detail::checked_fp8_codes(x)) : std::nullopt;
  if (!at::GradMode::is_enabled()) return fp8_linear_gelu_no_grad(x.x, weight, bias, codes, state, act_target);
  const std::optional<at::Tensor> codes_t = x.codes.defined() ? detail::checked_fp8_codes_t(x) : std::nullopt;
  const std::optional<at::Tensor> b = bias.defined() ? std::optional<at::Tensor>(bias) : std::nullopt;
  variable_list out = Fp8LinearGeluFunction::apply(x.x, weight, b, state.amax, state.scale, state.scale_inv, codes,
                                                   codes_t, act_target.scale, act_target.amax);
  return {std::move(out[0]), std::move(out[1]), std::move(out[2])};
}

}  // namespace perftrain::ops
