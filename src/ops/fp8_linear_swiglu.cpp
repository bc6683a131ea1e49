#include "ops/fp8_linear_swiglu.h"

#include <ATen/core/grad_mode.h>
#include <ATen/ops/empty.h>
#include <c10/core/DeviceGuard.h>
#include <torch/csrc/autograd/custom_function.h>

#include <optional>
#include <string>
#include <vector>

#include "base/error.h"
#include "kernels/fp8_cast.h"
#include "ops/fp8_linear.h"
#include "ops/fp8_linear_parts.h"
#include "ops/linear.h"
#include "ops/stacked_linear.h"
#include "ops/swiglu.h"

namespace perftrain::ops {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

constexpr const char* kOp = "fp8_linear_swiglu";

// Inputs: x, the weights' row blocks {gate, up}, the product's amax, scale,
// scale_inv, x's codes and transposed codes (where its producer wrote them),
// the consumer's x scale and amax. Outputs: h's stand-in (differentiable),
// its codes and transposed codes (not).
struct Fp8LinearSwigluFunction : torch::autograd::Function<Fp8LinearSwigluFunction> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x, at::TensorList weights,
                               const at::Tensor& amax, const at::Tensor& scale, const at::Tensor& scale_inv,
                               const std::optional<at::Tensor>& x_codes, const std::optional<at::Tensor>& x_codes_t,
                               const at::Tensor& act_scale, const at::Tensor& act_amax) {
    const c10::DeviceGuard guard(x.device());
    const int64_t m = detail::leading_rows(x), f = weights[0].size(0);
    // gate_up [M, 2F], kept for SwiGLU's backward.
    const detail::Fp8Product p =
        detail::fp8_forward_product(x, weights, at::Tensor(), x_codes, x_codes_t, scale, amax, scale_inv,
                                    x.requires_grad(), weights[0].requires_grad() || weights[1].requires_grad());
    const at::Tensor& gate_up = p.y;
    const auto codes_options = x.options().dtype(at::kFloat8_e4m3fn);
    at::Tensor codes = at::empty({m, f}, codes_options), codes_t = at::empty({f, m}, codes_options);
    detail::fp8_cast_transpose_prologue(gate_up, at::Tensor(), m, f, kernels::Fp8Prologue::kSwiglu, Fp8Format::kE4M3,
                                        act_scale, act_amax, codes, codes_t, at::Tensor());
    ctx->save_for_backward({p.xq.q_t, p.wq.q_t, gate_up});
    ctx->saved_data["amax"] = amax;
    ctx->saved_data["scale"] = scale;
    ctx->saved_data["scale_inv"] = scale_inv;
    detail::save_linear_shapes(ctx, x, weights[0], at::Tensor());  // n: F, one block's rows
    // The codes take no gradient: it arrives undefined, not as an fp8 zero fill each step.
    ctx->set_materialize_grads(false);
    ctx->mark_non_differentiable({codes, codes_t});
    return {detail::fp8_stand_in_for(x, f), codes, codes_t};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor &xq_t = saved[0], &wq_t = saved[1], &gate_up = saved[2];
    const at::Tensor amax = ctx->saved_data["amax"].toTensor(), scale = ctx->saved_data["scale"].toTensor(),
                     scale_inv = ctx->saved_data["scale_inv"].toTensor();
    const detail::LinearShapes s = detail::saved_linear_shapes(ctx);
    // Positions: x, gate, up, amax, scale, scale_inv, x_codes, x_codes_t, act_scale, act_amax.
    variable_list out(10);
    if (!grads[0].defined()) return out;
    const c10::DeviceGuard guard(gate_up.device());
    const int64_t m = s.m, f = s.n, k = s.x_sizes.back();
    const at::Tensor dh = grads[0].to(gate_up.scalar_type()).contiguous().view({m, f});
    const auto codes_options = gate_up.options().dtype(fp8_dtype(Fp8Format::kE5M2));
    const at::Tensor dq = at::empty({m, 2 * f}, codes_options), dq_t = at::empty({2 * f, m}, codes_options);
    detail::fp8_cast_transpose_prologue(dh, gate_up, m, f, kernels::Fp8Prologue::kSwigluBackward, Fp8Format::kE5M2,
                                        scale.select(0, kFp8Dy), amax.select(0, kFp8Dy), dq, dq_t, at::Tensor());
    if (ctx->needs_input_grad(0)) {
      out[0] = at::empty(s.x_sizes, dh.options());
      detail::fp8_linear_dx(dq, wq_t, scale_inv, out[0].view({m, k}));
    }
    if (ctx->needs_input_grad(1) || ctx->needs_input_grad(2)) {
      const at::Tensor dw = detail::fp8_linear_dw(dq_t, xq_t, scale_inv, s.w_dtype);
      const std::vector<at::Tensor> blocks = detail::row_blocks(dw, {f, f});
      for (int i = 0; i < 2; ++i)
        if (ctx->needs_input_grad(1 + i)) out[1 + i] = blocks[i];
    }
    return out;
  }
};

// Under no-grad (sampling): the product and h's codes from one row pass
// over gate_up, no transposes (a consumer that ever takes dW makes its own)
// and nothing saved: 4 bytes an element of h read and 1 written.
Fp8Operand fp8_linear_swiglu_no_grad(const at::Tensor& x, const std::vector<at::Tensor>& weights,
                                     const std::optional<at::Tensor>& x_codes, const Fp8Scaling& state,
                                     const Fp8Target& act_target) {
  const c10::DeviceGuard guard(x.device());
  const int64_t m = detail::leading_rows(x), f = weights[0].size(0);
  const detail::Fp8Product p = detail::fp8_forward_product(x, weights, at::Tensor(), x_codes, std::nullopt,
                                                           state.scale, state.amax, state.scale_inv, false, false);
  const at::Tensor codes = at::empty({m, f}, x.options().dtype(at::kFloat8_e4m3fn));
  detail::fp8_cast_activation(p.y, m, f, kernels::Fp8Prologue::kSwiglu, Fp8Format::kE4M3, act_target.scale,
                              act_target.amax, codes);
  return {detail::fp8_stand_in_for(x, f), codes, at::Tensor()};
}

void check_blocks(const std::vector<at::Tensor>& weights) {
  if (weights.size() != 2 || !weights[0].defined() || !weights[1].defined() || weights[0].dim() != 2 ||
      weights[1].dim() != 2 || weights[0].size(0) != weights[1].size(0))
    throw UsageError(std::string(kOp) + ": the weights must be {gate [F, K], up [F, K]} of one F");
}

}  // namespace

bool fp8_linear_swiglu_supported(const at::Tensor& x, int64_t f, int64_t next_n) {
  return fp8_linear_supported(x, 2 * f) && (!x.is_cuda() || (f % 16 == 0 && next_n % 16 == 0));
}

Fp8Operand fp8_linear_swiglu_reference(const Fp8Operand& x, const std::vector<at::Tensor>& weights,
                                       const Fp8Scaling& state, const Fp8Target& act_target) {
  return fp8_operand_of(swiglu(fp8_linear(x, weights, state)), act_target, kOp);
}

Fp8Operand fp8_linear_swiglu(const Fp8Operand& x, const std::vector<at::Tensor>& weights, const Fp8Scaling& state,
                             const Fp8Target& act_target) {
  check_blocks(weights);
  detail::check_fp8_linear_args(x.x, weights, state);
  check_fp8_target(act_target, x.x, kOp);
  if (!x.x.is_cuda() || x.x.scalar_type() != at::kBFloat16)
    return fp8_linear_swiglu_reference(x, weights, state, act_target);
  const std::optional<at::Tensor> codes =
      x.codes.defined() ? std::optional<at::Tensor>(detail::checked_fp8_codes(x)) : std::nullopt;
  if (!at::GradMode::is_enabled()) return fp8_linear_swiglu_no_grad(x.x, weights, codes, state, act_target);
  const std::optional<at::Tensor> codes_t = x.codes.defined() ? detail::checked_fp8_codes_t(x) : std::nullopt;
  variable_list out = Fp8LinearSwigluFunction::apply(x.x, at::TensorList(weights), state.amax, state.scale,
                                                     state.scale_inv, codes, codes_t, act_target.scale,
                                                     act_target.amax);
  return {std::move(out[0]), std::move(out[1]), std::move(out[2])};
}

}  // namespace perftrain::ops
