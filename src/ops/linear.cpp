#include "ops/linear.h"

#include <ATen/TensorOperators.h>
#include <ATen/ops/addmm.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/linear.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/zeros.h>
#include <c10/core/DeviceGuard.h>
#include <c10/util/irange.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "base/error.h"
#include "ops/column_sums.h"
#include "ops/compute_weights.h"
#include "ops/dtype_dispatch.h"
#include "ops/weight_grad_stream.h"

namespace perftrain::ops {

using kernels::GemmEpilogue;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

namespace detail {
namespace {

// a b with fp32 accumulation, written in `dtype` (upcasts first when the
// inputs are narrower: the fallback keeps the fused path's precision).
at::Tensor mm_in(const at::Tensor& a, const at::Tensor& b, at::ScalarType dtype) {
  if (a.scalar_type() == dtype) return at::mm(a, b);
  return at::mm(a.to(dtype), b.to(dtype));
}

}  // namespace

void check_linear_args(const char* op, const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
  const std::string name(op);
  if (!x.defined()) throw UsageError(name + ": x is undefined");
  if (x.dim() < 1) throw UsageError(name + ": x must be [..., K] with at least one dimension, got a 0-d tensor");
  gemm_dtype(x.scalar_type(), (name + ": x").c_str());
  check_linear_params(op, x.size(-1), x.scalar_type(), x.device(), weight, bias);
}

void check_linear_params(const char* op, int64_t k, at::ScalarType dtype, at::Device device, const at::Tensor& weight,
                         const at::Tensor& bias) {
  const std::string name(op);
  if (!weight.defined() || weight.dim() != 2)
    throw UsageError(name + ": weight must be a 2-D tensor [N, K], got " +
                     (weight.defined() ? shape(weight) : std::string("an undefined tensor")));
  if (weight.size(1) != k)
    throw UsageError(name + ": the input has K=" + std::to_string(k) + " features (its last dimension) but weight is " +
                     shape(weight) + "; expected weight [N, " + std::to_string(k) + "]");
  auto check_param = [&](const at::Tensor& p, const char* what) {
    if (p.scalar_type() != at::kFloat && p.scalar_type() != dtype)
      throw UsageError(name + ": " + what + " must be float32 or the input's dtype (" + c10::toString(dtype) +
                       "), got " + c10::toString(p.scalar_type()));
    if (p.device() != device)
      throw UsageError(name + ": " + what + " is on " + p.device().str() + " but the input is on " + device.str());
  };
  check_param(weight, "weight");
  if (bias.defined()) {
    if (bias.dim() != 1 || bias.size(0) != weight.size(0))
      throw UsageError(name + ": bias must be [N] = [" + std::to_string(weight.size(0)) + "] to match weight " +
                       shape(weight) + ", got " + shape(bias));
    check_param(bias, "bias");
  }
}

void linear_forward_product(const at::Tensor& x2, const at::Tensor& w, const at::Tensor& bias, const at::Tensor& y2) {
  at::Tensor out = y2;  // a handle on the same storage
  if (cublaslt_path(x2, w)) {
    if (!bias.defined()) {
      if (try_gemm_lt(x2, false, w, true, y2, GemmEpilogue::kDefault)) return;
      note_gemm_fallback();
    } else {
      // The fp32 master bias straight into the epilogue where cuBLASLt takes
      // it; else the bias cast to the compute dtype (still fused).
      if (try_gemm_lt(x2, false, w, true, y2, GemmEpilogue::kBias, bias)) return;
      if (bias.scalar_type() != x2.scalar_type() &&
          try_gemm_lt(x2, false, w, true, y2, GemmEpilogue::kBias, compute_weight(bias, x2.scalar_type())))
        return;
      note_gemm_fallback();  // the epilogue was refused: product, then add
      if (try_gemm_lt(x2, false, w, true, y2, GemmEpilogue::kDefault)) {
        out.add_(bias);
        return;
      }
    }
  }
  at::mm_out(out, x2, w.t());
  if (bias.defined()) out.add_(bias);
}

void linear_input_grad(const at::Tensor& dy, const at::Tensor& w, const at::Tensor& dx2, bool accumulate) {
  if (cublaslt_path(dy, w)) {
    if (try_gemm_lt(dy, false, w, false, dx2, GemmEpilogue::kDefault, at::Tensor(), at::Tensor(), accumulate)) return;
    note_gemm_fallback();
  }
  at::Tensor out = dx2;
  if (accumulate) {
    out.addmm_(dy, w);
  } else {
    at::mm_out(out, dy, w);
  }
}

void linear_weight_grad_into(const at::Tensor& dy, const at::Tensor& x2, const at::Tensor& dw, const at::Tensor& db) {
  if (dw.defined()) {
    // dW[N, K] = dY^T X.
    bool done = false;
    if (cublaslt_path(dy, x2)) {
      done = try_gemm_lt(dy, true, x2, false, dw, GemmEpilogue::kDefault);
      if (!done) note_gemm_fallback();
    }
    if (!done) {
      at::Tensor dw_out = dw;  // a handle on the same storage
      dw_out.copy_(mm_in(dy.t(), x2, dw.scalar_type()));
    }
  }
  if (db.defined()) column_sums_into({dy}, {db});
}

void check_column_blocks(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                         const std::vector<int64_t>& widths) {
  check_linear_args("linear_column_blocks", x, weight, bias);
  int64_t sum = 0;
  bool positive = !widths.empty();
  for (const int64_t n : widths) positive = positive && n > 0, sum += n;
  if (!positive || sum != weight.size(0))
    throw UsageError("linear_column_blocks: widths must be positive and add up to the weight's " +
                     std::to_string(weight.size(0)) + " output features, got " + c10::str(c10::IntArrayRef(widths)));
}

int64_t leading_rows(const at::Tensor& x) { return leading_rows(x.sizes()); }

int64_t leading_rows(at::IntArrayRef sizes) {
  int64_t m = 1;
  for (const auto i : c10::irange(int64_t(sizes.size()) - 1)) m *= sizes[i];
  return m;
}

at::Tensor linear_forward(const at::Tensor& x2, at::IntArrayRef x_sizes, const at::Tensor& w, const at::Tensor& bias) {
  std::vector<int64_t> out_sizes = x_sizes.vec();
  out_sizes.back() = w.size(0);
  at::Tensor y = at::empty(out_sizes, x2.options());
  linear_forward_product(x2, w, bias.defined() ? bias.contiguous() : bias, y.view({x2.size(0), w.size(0)}));
  return y;
}

LinearGrads linear_backward(const at::Tensor& grad, const at::Tensor& x2, const at::Tensor& w,
                            at::IntArrayRef x_sizes, at::ScalarType dtype, bool want_x,
                            std::optional<at::ScalarType> weight_dtype, std::optional<at::ScalarType> bias_dtype) {
  LinearGrads g;
  if (!want_x && !weight_dtype && !bias_dtype) return g;
  const int64_t m = leading_rows(x_sizes), k = x_sizes.back(), n = grad.size(-1);
  // A broadcast or non-contiguous incoming gradient is made dense once.
  const at::Tensor dy = grad.to(dtype).contiguous().view({m, n});

  // The weight gradient first: beside the input gradient when the step
  // runs them on two streams (ops/weight_grad_stream.h).
  if (weight_dtype) g.weight = at::empty({n, k}, dy.options().dtype(*weight_dtype));
  if (bias_dtype) g.bias = at::empty({n}, dy.options().dtype(*bias_dtype));
  if (g.weight.defined() || g.bias.defined())
    run_weight_grads([&] { linear_weight_grad_into(dy, x2, g.weight, g.bias); }, {dy, x2});
  if (want_x) {
    g.x = at::empty(x_sizes, dy.options());
    linear_input_grad(dy, w, g.x.view({m, k}));
  }
  return g;
}

void save_linear_shapes(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
  ctx->saved_data["x_sizes"] = x.sizes().vec();
  ctx->saved_data["m"] = leading_rows(x);
  ctx->saved_data["n"] = weight.size(0);
  ctx->saved_data["dtype"] = int64_t(x.scalar_type());
  ctx->saved_data["w_dtype"] = int64_t(weight.scalar_type());
  ctx->saved_data["b_dtype"] = bias.defined() ? int64_t(bias.scalar_type()) : int64_t(-1);
}

LinearShapes saved_linear_shapes(AutogradContext* ctx) {
  LinearShapes s;
  s.x_sizes = ctx->saved_data["x_sizes"].toIntVector();
  s.m = ctx->saved_data["m"].toInt();
  s.n = ctx->saved_data["n"].toInt();
  s.dtype = static_cast<at::ScalarType>(ctx->saved_data["dtype"].toInt());
  s.w_dtype = static_cast<at::ScalarType>(ctx->saved_data["w_dtype"].toInt());
  const int64_t b = ctx->saved_data["b_dtype"].toInt();
  if (b >= 0) s.b_dtype = static_cast<at::ScalarType>(b);
  return s;
}

namespace {

std::optional<at::Tensor> optional_bias(const at::Tensor& bias) {
  return bias.defined() ? std::optional<at::Tensor>(bias) : std::nullopt;
}

// The forward of a linear layer's autograd function: y, with what the backward
// reads saved in ctx (linear_backward's x2 and w, and the shapes).
at::Tensor forward_and_save(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                            const at::Tensor& bias) {
  const c10::DeviceGuard device_guard(x.device());  // handle, stream and workspace of x's device
  const at::ScalarType dt = x.scalar_type();
  const at::Tensor x2 = x.contiguous().view({leading_rows(x), x.size(-1)});
  const at::Tensor w = compute_weight(weight, dt);  // the optimizer's bf16 copy, or a cast
  at::Tensor y = linear_forward(x2, x.sizes(), w, bias);
  // Only what the wanted gradients read: X for dW, W for dX.
  ctx->save_for_backward({weight.requires_grad() ? x2 : at::Tensor(), x.requires_grad() ? w : at::Tensor()});
  save_linear_shapes(ctx, x, weight, bias);
  return y;
}

struct LinearFunction : public torch::autograd::Function<LinearFunction> {
  // The bias travels as an optional: autograd functions take no undefined
  // tensors, but an absent optional is "no input here".
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                            const std::optional<at::Tensor>& bias_opt) {
    return forward_and_save(ctx, x, weight, bias_opt.value_or(at::Tensor()));
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    if (!grads[0].defined()) return {at::Tensor(), at::Tensor(), at::Tensor()};
    const variable_list saved = ctx->get_saved_variables();
    const LinearShapes s = saved_linear_shapes(ctx);
    const LinearGrads g = linear_backward(
        grads[0], saved[0], saved[1], s.x_sizes, s.dtype, ctx->needs_input_grad(0),
        ctx->needs_input_grad(1) ? std::optional(s.w_dtype) : std::nullopt,
        s.b_dtype && ctx->needs_input_grad(2) ? s.b_dtype : std::nullopt);  // no bias: two inputs
    return {g.x, g.weight, g.bias};
  }
};

// The layer with its output as column blocks (linear_column_blocks): one
// product forward; backward, each block's gradient read in place for its row
// block of dW (and of db) and its product into dx, the later ones accumulating.
struct LinearColumnBlocksFunction : public torch::autograd::Function<LinearColumnBlocksFunction> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                               const std::optional<at::Tensor>& bias_opt, const std::vector<int64_t>& widths) {
    const at::Tensor y = forward_and_save(ctx, x, weight, bias_opt.value_or(at::Tensor()));
    ctx->saved_data["widths"] = widths;
    variable_list blocks;
    int64_t off = 0;
    for (const int64_t n : widths) blocks.push_back(y.narrow(-1, off, n)), off += n;
    return blocks;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const std::vector<int64_t> widths = ctx->saved_data["widths"].toIntVector();
    const variable_list saved = ctx->get_saved_variables();
    const LinearShapes s = saved_linear_shapes(ctx);
    const at::Tensor &x2 = saved[0], &w = saved[1];
    const bool want_x = ctx->needs_input_grad(0), want_w = ctx->needs_input_grad(1);
    const bool want_b = s.b_dtype && ctx->needs_input_grad(2);  // no bias: two inputs
    std::vector<at::Tensor> dys;  // each block's gradient as [M, N_i], dense (in place when it is); undefined: zero
    for (const at::Tensor& g : grads) dys.push_back(g.defined() ? g.to(s.dtype).contiguous().view({s.m, g.size(-1)}) : g);
    const int64_t k = s.x_sizes.back();
    const at::TensorOptions o = x2.defined() ? x2.options() : w.options();
    at::Tensor dw = want_w ? at::empty({s.n, k}, o.dtype(s.w_dtype)) : at::Tensor();
    at::Tensor db = want_b ? at::empty({s.n}, o.dtype(*s.b_dtype)) : at::Tensor();
    if (want_w || want_b) {
      std::vector<at::Tensor> reads(dys);
      reads.push_back(x2);
      run_weight_grads(
          [&] {
            int64_t off = 0;
            for (size_t i = 0; i < widths.size(); off += widths[i], ++i) {
              const at::Tensor dwi = want_w ? dw.narrow(0, off, widths[i]) : at::Tensor();
              const at::Tensor dbi = want_b ? db.narrow(0, off, widths[i]) : at::Tensor();
              if (dys[i].defined()) {
                linear_weight_grad_into(dys[i], x2, dwi, dbi);
                continue;
              }
              for (at::Tensor z : {dwi, dbi})
                if (z.defined()) z.zero_();
            }
          },
          reads);
    }
    at::Tensor dx;
    if (want_x) {
      const bool any = std::any_of(dys.begin(), dys.end(), [](const at::Tensor& d) { return d.defined(); });
      dx = any ? at::empty(s.x_sizes, w.options()) : at::zeros(s.x_sizes, w.options());
      int64_t off = 0;
      bool first = true;
      for (size_t i = 0; i < widths.size(); off += widths[i], ++i) {
        if (!dys[i].defined()) continue;
        linear_input_grad(dys[i], w.narrow(0, off, widths[i]), dx.view({s.m, k}), !first);
        first = false;
      }
    }
    return {dx, dw, db, at::Tensor()};
  }
};

}  // namespace

std::vector<at::Tensor> linear_column_blocks_function(const at::Tensor& x, const at::Tensor& weight,
                                                      const at::Tensor& bias, const std::vector<int64_t>& widths) {
  check_column_blocks(x, weight, bias, widths);
  return LinearColumnBlocksFunction::apply(x, weight, optional_bias(bias), widths);
}

at::Tensor linear_function(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
  check_linear_args("linear", x, weight, bias);
  return LinearFunction::apply(x, weight, optional_bias(bias));
}

}  // namespace detail

at::Tensor linear_reference(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
  return at::linear(x.to(at::kFloat), weight.to(at::kFloat), bias.defined() ? bias.to(at::kFloat) : bias);
}

at::Tensor linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
  detail::check_linear_args("linear", x, weight, bias);
  if (!x.is_cuda()) return linear_reference(x, weight, bias).to(x.scalar_type());
  return detail::LinearFunction::apply(x, weight, detail::optional_bias(bias));
}

std::vector<at::Tensor> linear_column_blocks(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                                             const std::vector<int64_t>& widths) {
  detail::check_column_blocks(x, weight, bias, widths);
  if (x.is_cuda()) return detail::linear_column_blocks_function(x, weight, bias, widths);
  const at::Tensor y = linear_reference(x, weight, bias).to(x.scalar_type());
  std::vector<at::Tensor> blocks;
  int64_t off = 0;
  for (const int64_t n : widths) blocks.push_back(y.narrow(-1, off, n)), off += n;
  return blocks;
}

}  // namespace perftrain::ops
