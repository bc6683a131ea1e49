#include "ops/swiglu.h"

#include <ATen/TensorOperators.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/silu.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/csrc/autograd/custom_function.h>

#include <cstdint>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "base/error.h"
#include "kernels/swiglu.h"
#include "ops/compute_weights.h"
#include "ops/dtype_dispatch.h"
#include "ops/gemm_bias_gelu.h"
#include "ops/linear.h"
#include "ops/stacked_linear.h"
#include "ops/weight_grad_stream.h"

namespace perftrain::ops {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

namespace {

constexpr const char* kOp = "swiglu";

// gate_up defined, at least 1-d, an even last dimension of at least 2, and a
// floating dtype the op takes (float64 only for the reference).
void check_gate_up(const at::Tensor& gate_up, bool allow_double) {
  const std::string o(kOp);
  if (!gate_up.defined()) throw UsageError(o + ": gate_up must be a defined tensor");
  if (gate_up.dim() < 1) throw UsageError(o + ": gate_up must be [..., 2F], got a 0-d tensor");
  const int64_t n = gate_up.size(-1);
  if (n < 2 || n % 2 != 0)
    throw UsageError(o + ": gate_up's last dimension must be 2F (even, F >= 1: gate then up), got shape " +
                     shape(gate_up));
  if (allow_double && gate_up.scalar_type() == at::kDouble) return;
  check_kernel_dtype(kOp, gate_up.scalar_type(), "gate_up");
}

// F within what swiglu's CUDA kernels take.
void check_cuda_width(int64_t f) {
  if (f > kernels::kSwigluMaxCols)
    throw UsageError(std::string(kOp) + ": F=" + std::to_string(f) + " is wider than the CUDA kernels take (" +
                     std::to_string(kernels::kSwigluMaxCols) + ")");
}

// x and the gate and up weights as stacked_linear takes them, with as many
// gate rows as up rows.
void check_swiglu_product_args(const at::Tensor& x, const at::Tensor& gate_w, const at::Tensor& up_w) {
  detail::check_stacked_linear_args(x, {gate_w, up_w}, {});
  if (gate_w.size(0) != up_w.size(0))
    throw UsageError("swiglu_product: gate_w and up_w must have the same rows (F), got " + shape(gate_w) + " and " +
                     shape(up_w));
}

// Forward keeps gate_up (dense) and nothing else: the backward reads it and
// the incoming gradient, and writes d(gate_up) in one pass.
struct SwigluFunction : public torch::autograd::Function<SwigluFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& gate_up_in) {
    const c10::cuda::CUDAGuard guard(gate_up_in.device());
    const at::Tensor gate_up = gate_up_in.contiguous();
    const int64_t f = gate_up.size(-1) / 2;
    const int64_t rows = gate_up.numel() / (2 * f);
    std::vector<int64_t> sizes(gate_up.sizes().begin(), gate_up.sizes().end());
    sizes.back() = f;
    at::Tensor out = at::empty(sizes, gate_up.options());
    with_kernel_type(kOp, gate_up.scalar_type(), [&](auto tp) {
      using T = kernel_type<decltype(tp)>;
      kernels::swiglu_forward<T>(kernel_ptr<const T>(gate_up), kernel_ptr<T>(out), rows, int(f),
                                 at::cuda::getCurrentCUDAStream());
    });
    ctx->save_for_backward({gate_up});
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const at::Tensor gate_up = ctx->get_saved_variables()[0];
    if (!grads[0].defined()) return {at::Tensor()};
    return {detail::swiglu_backward_cuda(grads[0], gate_up)};
  }
};

// swiglu's forward kernel: gate_up [rows, 2F] dense -> out [rows, F].
void swiglu_activation_into(const at::Tensor& gate_up, const at::Tensor& out, int64_t rows, int64_t f) {
  with_kernel_type(kOp, gate_up.scalar_type(), [&](auto tp) {
    using T = kernel_type<decltype(tp)>;
    kernels::swiglu_forward<T>(kernel_ptr<const T>(gate_up), kernel_ptr<T>(out), rows, int(f),
                               at::cuda::getCurrentCUDAStream());
  });
}

at::Tensor swiglu_activation(const at::Tensor& gate_up, int64_t rows, int64_t f) {
  at::Tensor out = at::empty({rows, f}, gate_up.options());
  swiglu_activation_into(gate_up, out, rows, f);
  return out;
}

// x's sizes with the last one n.
std::vector<int64_t> sizes_with_last(const at::Tensor& x, int64_t n) {
  std::vector<int64_t> sizes(x.sizes().begin(), x.sizes().end());
  sizes.back() = n;
  return sizes;
}

// gate_up and h of the rows of x2 [rows, K] through the stacked weight w
// [2F, K]: the fused kernel where it applies, else the product then swiglu's kernel.
void gate_up_and_swiglu(const at::Tensor& x2, const at::Tensor& w, const at::Tensor& gate_up, const at::Tensor& h) {
  if (try_gemm_swiglu_sm90(x2, w, gate_up, h)) return;
  detail::linear_forward_product(x2, w, at::Tensor(), gate_up);
  swiglu_activation_into(gate_up, h, x2.size(0), h.size(1));
}

// Down's backward from dy [rows, n] through the activation made again from
// gate_up: d(gate_up) (want_gate_up) and down's weight gradient in w_dtype
// (want_w; first, beside the input gradient when the step runs two streams,
// as linear's: ops/weight_grad_stream.h).
std::pair<at::Tensor, at::Tensor> swiglu_linear_grads(const at::Tensor& dy, const at::Tensor& gate_up,
                                                      const at::Tensor& w, at::ScalarType w_dtype, bool want_gate_up,
                                                      bool want_w) {
  const int64_t f = gate_up.size(-1) / 2, rows = gate_up.numel() / (2 * f), n = w.size(0);
  at::Tensor dw, dgate_up;
  if (want_w) {
    const at::Tensor act = swiglu_activation(gate_up, rows, f);
    dw = at::empty({n, f}, dy.options().dtype(w_dtype));
    run_weight_grads([&] { detail::linear_weight_grad_into(dy, act, dw, at::Tensor()); }, {dy, act});
  }
  if (want_gate_up) {
    at::Tensor dact = at::empty({rows, f}, dy.options());
    detail::linear_input_grad(dy, w, dact);
    dgate_up = detail::swiglu_backward_cuda(dact, gate_up);
  }
  return {dgate_up, dw};
}

// swiglu(stacked_linear(x, {gate_w, up_w})), and with down_w given
// linear(that, down_w) without keeping the activation, with both forwards
// in one kernel where it applies. Keeps x (as [rows, K]) for the weights'
// gradients, the stacked weight for x's, gate_up for swiglu's backward, and
// down's compute weight. An absent down_w travels as nullopt: an autograd
// function takes no undefined tensor (it asks every input for its device).
struct SwigluProductFunction : public torch::autograd::Function<SwigluProductFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& gate_w,
                            const at::Tensor& up_w, const std::optional<at::Tensor>& down) {
    const c10::cuda::CUDAGuard guard(x.device());
    const at::Tensor down_w = down.value_or(at::Tensor());
    const int64_t k = x.size(-1), rows = x.numel() / k, f = gate_w.size(0);
    const at::Tensor w = detail::stacked_weights_in({gate_w, up_w}, x.scalar_type());
    const at::Tensor x2 = x.contiguous().view({rows, k});
    const at::Tensor gate_up = at::empty({rows, 2 * f}, x.options());
    at::Tensor h = at::empty(sizes_with_last(x, f), x.options());
    gate_up_and_swiglu(x2, w, gate_up, h.view({rows, f}));
    at::Tensor wd, out = h;
    if (down_w.defined()) {  // h lives just long enough for down's product
      wd = compute_weight(down_w, x.scalar_type());  // the optimizer's bf16 copy, or a cast
      out = at::empty(sizes_with_last(x, wd.size(0)), x.options());
      detail::linear_forward_product(h.view({rows, f}), wd, at::Tensor(), out.view({rows, wd.size(0)}));
      ctx->saved_data["down_dtype"] = int64_t(down_w.scalar_type());
    }
    const bool weights_grad = gate_w.requires_grad() || up_w.requires_grad();
    ctx->save_for_backward({weights_grad ? x2 : at::Tensor(), x.requires_grad() ? w : at::Tensor(), gate_up, wd});
    ctx->saved_data["x_sizes"] = x.sizes().vec();
    ctx->saved_data["w_dtype"] = int64_t(gate_w.scalar_type());
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    if (!grads[0].defined()) return {at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor &x2 = saved[0], &w = saved[1], &gate_up = saved[2], &wd = saved[3];
    const c10::cuda::CUDAGuard guard(gate_up.device());
    const bool want_w = ctx->needs_input_grad(1) || ctx->needs_input_grad(2);
    const int64_t f = gate_up.size(1) / 2;  // gate_up is [rows, 2F]
    at::Tensor dgate_up, dwd;
    if (wd.defined()) {
      const at::Tensor dy = grads[0].to(gate_up.scalar_type()).contiguous().view({gate_up.size(0), wd.size(0)});
      std::tie(dgate_up, dwd) = swiglu_linear_grads(
          dy, gate_up, wd, static_cast<at::ScalarType>(ctx->saved_data["down_dtype"].toInt()),
          want_w || ctx->needs_input_grad(0), ctx->needs_input_grad(3));
    } else {
      dgate_up = detail::swiglu_backward_cuda(grads[0], gate_up);
    }
    if (!dgate_up.defined()) return {at::Tensor(), at::Tensor(), at::Tensor(), dwd};
    const detail::StackedLinearGrads g = detail::stacked_linear_backward(
        dgate_up, x2, w, ctx->saved_data["x_sizes"].toIntVector(), gate_up.scalar_type(), ctx->needs_input_grad(0),
        want_w ? std::optional(static_cast<at::ScalarType>(ctx->saved_data["w_dtype"].toInt())) : std::nullopt,
        std::nullopt);
    const std::vector<at::Tensor> dw = detail::row_blocks(g.weight, {f, f});
    return {g.x, ctx->needs_input_grad(1) ? dw[0] : at::Tensor(), ctx->needs_input_grad(2) ? dw[1] : at::Tensor(),
            dwd};
  }
};

// down(swiglu(gate_up)) keeping gate_up and the weight only: the activation
// lives in forward just long enough for the product, and again in backward
// just long enough for the weight gradient.
struct SwigluLinearFunction : public torch::autograd::Function<SwigluLinearFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& gate_up_in, const at::Tensor& weight) {
    const c10::cuda::CUDAGuard guard(gate_up_in.device());
    const at::Tensor gate_up = gate_up_in.contiguous();
    const int64_t f = gate_up.size(-1) / 2, rows = gate_up.numel() / (2 * f), n = weight.size(0);
    const at::Tensor w = compute_weight(weight, gate_up.scalar_type());  // the optimizer's bf16 copy, or a cast
    at::Tensor y = at::empty(sizes_with_last(gate_up, n), gate_up.options());
    detail::linear_forward_product(swiglu_activation(gate_up, rows, f), w, at::Tensor(), y.view({rows, n}));
    ctx->save_for_backward({gate_up, w});
    ctx->saved_data["w_dtype"] = int64_t(weight.scalar_type());
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    if (!grads[0].defined()) return {at::Tensor(), at::Tensor()};
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor &gate_up = saved[0], &w = saved[1];
    const c10::cuda::CUDAGuard guard(gate_up.device());
    const int64_t rows = gate_up.numel() / gate_up.size(-1);
    const at::Tensor dy = grads[0].to(gate_up.scalar_type()).contiguous().view({rows, w.size(0)});
    const auto [dgate_up, dw] =
        swiglu_linear_grads(dy, gate_up, w, static_cast<at::ScalarType>(ctx->saved_data["w_dtype"].toInt()),
                            ctx->needs_input_grad(0), ctx->needs_input_grad(1));
    return {dgate_up, dw};
  }
};

}  // namespace

namespace detail {

at::Tensor swiglu_backward_cuda(const at::Tensor& grad, const at::Tensor& gate_up_in) {
  const c10::cuda::CUDAGuard guard(gate_up_in.device());
  const at::Tensor gate_up = gate_up_in.contiguous();
  const at::Tensor dout = grad.to(gate_up.scalar_type()).contiguous();
  const int64_t f = gate_up.size(-1) / 2;
  const int64_t rows = gate_up.numel() / (2 * f);
  at::Tensor dgate_up = at::empty(gate_up.sizes(), gate_up.options());
  with_kernel_type(kOp, gate_up.scalar_type(), [&](auto tp) {
    using T = kernel_type<decltype(tp)>;
    kernels::swiglu_backward<T>(kernel_ptr<const T>(dout), kernel_ptr<const T>(gate_up), kernel_ptr<T>(dgate_up),
                                rows, int(f), at::cuda::getCurrentCUDAStream());
  });
  return dgate_up;
}

}  // namespace detail

at::Tensor swiglu_reference(const at::Tensor& gate_up) {
  check_gate_up(gate_up, /*allow_double=*/true);
  const int64_t f = gate_up.size(-1) / 2;
  const at::ScalarType ct = gate_up.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  const at::Tensor gu = gate_up.to(ct);
  return (at::silu(gu.narrow(-1, 0, f)) * gu.narrow(-1, f, f)).to(gate_up.scalar_type());
}

at::Tensor swiglu(const at::Tensor& gate_up) {
  check_gate_up(gate_up, /*allow_double=*/false);
  if (!gate_up.is_cuda()) return swiglu_reference(gate_up);
  check_cuda_width(gate_up.size(-1) / 2);
  return SwigluFunction::apply(gate_up);
}

at::Tensor swiglu_product(const at::Tensor& x, const at::Tensor& gate_w, const at::Tensor& up_w) {
  check_swiglu_product_args(x, gate_w, up_w);
  if (!x.is_cuda()) return swiglu(stacked_linear(x, {gate_w, up_w}));
  check_cuda_width(gate_w.size(0));
  return SwigluProductFunction::apply(x, gate_w, up_w, std::nullopt);
}

at::Tensor swiglu_product_linear(const at::Tensor& x, const at::Tensor& gate_w, const at::Tensor& up_w,
                                 const at::Tensor& down_weight) {
  check_swiglu_product_args(x, gate_w, up_w);
  detail::check_linear_params("swiglu_product_linear down", gate_w.size(0), x.scalar_type(), x.device(),
                              down_weight, at::Tensor());
  if (!x.is_cuda()) return swiglu_linear(stacked_linear(x, {gate_w, up_w}), down_weight);
  check_cuda_width(gate_w.size(0));
  return SwigluProductFunction::apply(x, gate_w, up_w, std::optional<at::Tensor>(down_weight));
}

at::Tensor swiglu_linear(const at::Tensor& gate_up, const at::Tensor& down_weight) {
  check_gate_up(gate_up, /*allow_double=*/false);
  const int64_t f = gate_up.size(-1) / 2;
  detail::check_linear_params("swiglu_linear down", f, gate_up.scalar_type(), gate_up.device(), down_weight,
                              at::Tensor());
  if (!gate_up.is_cuda()) return ops::linear(swiglu(gate_up), down_weight);
  check_cuda_width(f);
  return SwigluLinearFunction::apply(gate_up, down_weight);
}

}  // namespace perftrain::ops
