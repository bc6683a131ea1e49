#include "ops/fp8_linear.h"

#include <ATen/TensorOperators.h>
#include <ATen/core/grad_mode.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/mm.h>
#include <c10/core/DeviceGuard.h>
#include <torch/csrc/autograd/custom_function.h>

#include <numeric>
#include <optional>
#include <string>
#include <vector>

#include "base/error.h"
#include "ops/column_sums.h"
#include "ops/compute_weights.h"
#include "ops/cublaslt_workspace.h"
#include "ops/dtype_dispatch.h"
#include "ops/fp8_linear_parts.h"
#include "ops/linear.h"
#include "ops/stacked_linear.h"

namespace perftrain::ops {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

namespace {

constexpr const char* kOp = "fp8_linear";

void check_x(const at::Tensor& x) {
  const std::string op(kOp);
  if (!x.defined() || x.dim() < 1) throw UsageError(op + ": x must be [..., K] with at least one dimension");
  if (x.scalar_type() != at::kBFloat16 && x.scalar_type() != at::kFloat)
    throw UsageError(op + ": x must be bfloat16 or float32, got " + std::string(c10::toString(x.scalar_type())));
}

// The state's and the sizes' checks, for a weight of n rows.
void check_state_and_sizes(const at::Tensor& x, int64_t n, const Fp8Scaling& s) {
  const std::string op(kOp);
  const std::vector<Fp8Format> want = {Fp8Format::kE4M3, Fp8Format::kE4M3, Fp8Format::kE5M2};
  if (s.formats != want || !s.amax.defined())
    throw UsageError(op + ": the state must come from make_fp8_linear_scaling (slots x, w: e4m3; dy: e5m2)");
  if (s.amax.device() != x.device())
    throw UsageError(op + ": the fp8 state is on " + s.amax.device().str() + " but x is on " + x.device().str());
  if (!fp8_linear_supported(x, n))
    throw UsageError(op + ": cuBLASLt's fp8 products need M, K and N multiples of 16, got M=" +
                     std::to_string(detail::leading_rows(x)) + " K=" + std::to_string(x.size(-1)) +
                     " N=" + std::to_string(n) + " (use ops::linear there)");
}

void check_args(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias, const Fp8Scaling& s) {
  check_x(x);
  detail::check_linear_params(kOp, x.size(-1), x.scalar_type(), x.device(), weight, bias);
  check_state_and_sizes(x, weight.size(0), s);
}

// Row blocks [N_i, K] of one weight: at least one, one K, one dtype.
void check_args(const at::Tensor& x, const std::vector<at::Tensor>& weights, const Fp8Scaling& s) {
  const std::string op(kOp);
  check_x(x);
  if (weights.empty()) throw UsageError(op + ": the weight's row blocks are empty (give at least one)");
  int64_t n = 0;
  for (size_t i = 0; i < weights.size(); ++i) {
    const at::Tensor& w = weights[i];
    if (!w.defined() || w.dim() != 2)
      throw UsageError(op + ": row block " + std::to_string(i) + " of the weight must be a 2-D tensor [N_i, K]");
    if (w.size(1) != weights[0].size(1))
      throw UsageError(op + ": the weight's row blocks must share K, got " + std::to_string(weights[0].size(1)) +
                       " (block 0) and " + std::to_string(w.size(1)) + " (block " + std::to_string(i) + ")");
    if (w.scalar_type() != weights[0].scalar_type())
      throw UsageError(op + ": the weight's row blocks must share one dtype, got " +
                       c10::toString(weights[0].scalar_type()) + " (block 0) and " + c10::toString(w.scalar_type()) +
                       " (block " + std::to_string(i) + ")");
    detail::check_linear_params(kOp, x.size(-1), x.scalar_type(), x.device(), w, at::Tensor());
    n += w.size(0);
  }
  check_state_and_sizes(x, n, s);
}

// q (and q_t where `transposed`) of x [rows, cols] for slot i of the state
// given by its tensors.
Fp8Casts cast_slot(const at::Tensor& x, const at::Tensor& scale, const at::Tensor& amax, int slot, Fp8Format f,
                   bool rows, bool transposed, const char* what) {
  if (!transposed) return {fp8_cast(x, scale.select(0, slot), amax.select(0, slot), f, what), at::Tensor()};
  return fp8_cast_transpose(x, scale.select(0, slot), amax.select(0, slot), f, rows, what);
}

// dY's E5M2 codes, their transpose and db's column partials
// [fp8_cast_partial_rows(m), n] fp32 from one cast-transpose of dy [m, n]
// (bf16, CUDA): db then costs no second read of dY.
Fp8Casts dy_codes_and_partials(const at::Tensor& dy, const at::Tensor& scale, const at::Tensor& amax,
                               at::Tensor& partials) {
  const int64_t m = dy.size(0), n = dy.size(1);
  const auto options = dy.options().dtype(fp8_dtype(Fp8Format::kE5M2));
  Fp8Casts out{at::empty({m, n}, options), at::empty({n, m}, options)};
  partials = at::empty({kernels::fp8_cast_partial_rows(m), n}, dy.options().dtype(at::kFloat));
  detail::fp8_cast_transpose_prologue(dy, at::Tensor(), m, n, kernels::Fp8Prologue::kNone, Fp8Format::kE5M2,
                                      scale.select(0, kFp8Dy), amax.select(0, kFp8Dy), out.q, out.q_t, partials);
  return out;
}

}  // namespace

namespace detail {

void fp8_product(const at::Tensor& a, const at::Tensor& a_scale_inv, const at::Tensor& b,
                 const at::Tensor& b_scale_inv, const at::Tensor& d, bool fast_accum, const at::Tensor& bias) {
  if (cublaslt_path(a, b) && d.numel() > 0) {
    if (try_gemm_lt_fp8(a, a_scale_inv, b, b_scale_inv, d, fast_accum, bias)) return;
    if (bias.defined() && bias.scalar_type() != at::kBFloat16 &&
        try_gemm_lt_fp8(a, a_scale_inv, b, b_scale_inv, d, fast_accum, compute_weight(bias, at::kBFloat16)))
      return;
    note_gemm_fallback();
  }
  at::Tensor r = at::mm(fp8_dequantize_reference(a, a_scale_inv), fp8_dequantize_reference(b, b_scale_inv).t());
  if (bias.defined()) r = r + bias.to(at::kFloat);
  at::Tensor out = d;  // a handle on the same storage
  out.copy_(r);
}

Fp8Casts fp8_input_codes(const at::Tensor& x2d, const std::optional<at::Tensor>& x_codes,
                         const std::optional<at::Tensor>& x_codes_t, const at::Tensor& scale, const at::Tensor& amax,
                         bool transposed) {
  if (!x_codes)
    return cast_slot(x2d, scale, amax, kFp8X, Fp8Format::kE4M3, true, transposed, "fp8_linear x");
  if (!transposed) return {*x_codes, at::Tensor()};
  return {*x_codes, x_codes_t ? *x_codes_t : fp8_transpose(*x_codes, kOp)};
}

Fp8Casts fp8_weight_codes(at::TensorList weights, at::ScalarType dt, const at::Tensor& scale, const at::Tensor& amax,
                          bool transposed) {
  const char* what = "fp8_linear weight";
  if (weights.size() == 1)
    return cast_slot(compute_weight(weights[0], dt).contiguous(), scale, amax, kFp8W, Fp8Format::kE4M3, true,
                     transposed, what);
  int64_t n = 0;
  for (const at::Tensor& w : weights) n += w.size(0);
  const int64_t k = weights[0].size(1);
  const auto options = weights[0].options().dtype(fp8_dtype(Fp8Format::kE4M3));
  Fp8Casts out{at::empty({n, k}, options), transposed ? at::empty({k, n}, options) : at::Tensor()};
  int64_t offset = 0;
  for (const at::Tensor& w : weights) {
    const int64_t rows = w.size(0);
    fp8_cast_into(compute_weight(w, dt).contiguous(), scale.select(0, kFp8W), amax.select(0, kFp8W),
                  Fp8Format::kE4M3, out.q.narrow(0, offset, rows),
                  transposed ? out.q_t.narrow(1, offset, rows) : at::Tensor(), what);
    offset += rows;
  }
  return out;
}

void fp8_linear_dx(const at::Tensor& dq, const at::Tensor& wq_t, const at::Tensor& scale_inv, const at::Tensor& dx) {
  fp8_product(dq, scale_inv.select(0, kFp8Dy), wq_t, scale_inv.select(0, kFp8W), dx, false, at::Tensor());
}

at::Tensor fp8_linear_dw(const at::Tensor& dq_t, const at::Tensor& xq_t, const at::Tensor& scale_inv,
                         at::ScalarType w_dtype) {
  const at::Tensor dw = at::empty({dq_t.size(0), xq_t.size(0)}, dq_t.options().dtype(w_dtype));
  fp8_product(dq_t, scale_inv.select(0, kFp8Dy), xq_t, scale_inv.select(0, kFp8X), dw, false, at::Tensor());
  return dw;
}

void check_fp8_linear_args(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                           const Fp8Scaling& state) {
  check_args(x, weight, bias, state);
}

void check_fp8_linear_args(const at::Tensor& x, const std::vector<at::Tensor>& weights, const Fp8Scaling& state) {
  check_args(x, weights, state);
}

at::Tensor checked_fp8_codes(const Fp8Operand& x) {
  const int64_t m = detail::leading_rows(x.x), k = x.x.size(-1);
  if (x.codes.dim() != 2 || x.codes.size(0) != m || x.codes.size(1) != k ||
      x.codes.scalar_type() != at::kFloat8_e4m3fn || x.codes.device() != x.x.device())
    throw UsageError(std::string(kOp) + ": x's codes must be [" + std::to_string(m) + ", " + std::to_string(k) +
                     "] float8_e4m3fn on x's device, got " + shape(x.codes) + " " +
                     std::string(c10::toString(x.codes.scalar_type())));
  return x.codes.contiguous();
}

std::optional<at::Tensor> checked_fp8_codes_t(const Fp8Operand& x) {
  if (!x.codes_t.defined()) return std::nullopt;
  if (x.codes_t.dim() != 2 || x.codes_t.size(0) != x.codes.size(1) || x.codes_t.size(1) != x.codes.size(0) ||
      x.codes_t.scalar_type() != at::kFloat8_e4m3fn || x.codes_t.device() != x.x.device())
    throw UsageError(std::string(kOp) + ": x's transposed codes must be [" + std::to_string(x.codes.size(1)) + ", " +
                     std::to_string(x.codes.size(0)) + "] float8_e4m3fn on x's device, got " + shape(x.codes_t));
  return x.codes_t.contiguous();
}

at::Tensor grad_mode_input(const at::Tensor& t) { return at::GradMode::is_enabled() ? t : t.detach(); }

std::vector<at::Tensor> grad_mode_inputs(const std::vector<at::Tensor>& ts) {
  std::vector<at::Tensor> out;
  out.reserve(ts.size());
  for (const at::Tensor& t : ts) out.push_back(grad_mode_input(t));
  return out;
}

Fp8Product fp8_forward_product(const at::Tensor& x, at::TensorList weights, const at::Tensor& bias,
                               const std::optional<at::Tensor>& x_codes, const std::optional<at::Tensor>& x_codes_t,
                               const at::Tensor& scale, const at::Tensor& amax, const at::Tensor& scale_inv,
                               bool need_dx, bool need_dw) {
  const int64_t m = leading_rows(x), k = x.size(-1);
  int64_t n = 0;
  for (const at::Tensor& w : weights) n += w.size(0);
  Fp8Product p;
  p.xq = fp8_input_codes(x_codes ? x : x.contiguous().view({m, k}), x_codes, x_codes_t, scale, amax, need_dw);
  p.wq = fp8_weight_codes(weights, x.scalar_type(), scale, amax, need_dx);
  p.y = at::empty({m, n}, x.options());
  fp8_product(p.xq.q, scale_inv.select(0, kFp8X), p.wq.q, scale_inv.select(0, kFp8W), p.y, true,
              bias.defined() ? bias.contiguous() : bias);
  return p;
}

at::Tensor fp8_stand_in_for(const at::Tensor& x, int64_t n) {
  std::vector<int64_t> sizes = x.sizes().vec();
  sizes.back() = n;
  return fp8_stand_in(sizes, x.options());
}

}  // namespace detail

namespace {

std::vector<int64_t> with_last(at::IntArrayRef sizes, int64_t last) {
  std::vector<int64_t> out = sizes.vec();
  out.back() = last;
  return out;
}

struct Fp8LinearFunction : public torch::autograd::Function<Fp8LinearFunction> {
  // The weight as its row blocks (one or more; the product uses their
  // concatenation), each given its own gradient as a row block of one buffer.
  // The state's amax, scale and scale_inv travel as inputs (no gradient).
  // x_codes: x's E4M3 codes as its producer wrote them (then x's values are not read);
  // x_codes_t: their transpose where the producer wrote it too (else made here for dW).
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, at::TensorList weights,
                            const std::optional<at::Tensor>& bias_opt, const at::Tensor& amax, const at::Tensor& scale,
                            const at::Tensor& scale_inv, const std::optional<at::Tensor>& x_codes,
                            const std::optional<at::Tensor>& x_codes_t) {
    const at::Tensor bias = bias_opt.value_or(at::Tensor());
    const c10::DeviceGuard device_guard(x.device());
    std::vector<int64_t> rows;
    bool need_dw = false;
    for (const at::Tensor& w : weights) {
      rows.push_back(w.size(0));
      need_dw = need_dw || w.requires_grad();
    }
    const int64_t n = std::accumulate(rows.begin(), rows.end(), int64_t(0));
    const detail::Fp8Product p =
        detail::fp8_forward_product(x, weights, bias, x_codes, x_codes_t, scale, amax, scale_inv, x.requires_grad(),
                                    need_dw);
    const at::Tensor y = p.y.view(with_last(x.sizes(), n));
    // x^T for dW, W^T for dX: what the wanted gradients read. The state's
    // tensors as plain values: the casts of a later forward (a shared layer,
    // another micro-batch) write its amax, which is no reason to refuse.
    ctx->save_for_backward({p.xq.q_t, p.wq.q_t});
    ctx->saved_data["amax"] = amax;
    ctx->saved_data["scale"] = scale;
    ctx->saved_data["scale_inv"] = scale_inv;
    detail::save_linear_shapes(ctx, x, weights[0], bias);
    ctx->saved_data["n"] = n;
    ctx->saved_data["rows"] = rows;
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor &xq_t = saved[0], &wq_t = saved[1];
    const at::Tensor amax = ctx->saved_data["amax"].toTensor(), scale = ctx->saved_data["scale"].toTensor(),
                     scale_inv = ctx->saved_data["scale_inv"].toTensor();
    const detail::LinearShapes s = detail::saved_linear_shapes(ctx);
    const std::vector<int64_t> rows = ctx->saved_data["rows"].toIntVector();
    const size_t count = rows.size();
    // Positions: x, the weight's blocks, bias, amax, scale, scale_inv, x_codes, x_codes_t.
    variable_list out(1 + count + 6);
    if (!grads[0].defined()) return out;
    const int64_t m = s.m, n = s.n, k = s.x_sizes.back();
    const at::Tensor dy = grads[0].to(s.dtype).contiguous().view({m, n});
    bool need_dw = false;
    for (size_t i = 0; i < count; ++i) need_dw = need_dw || ctx->needs_input_grad(1 + i);
    const bool need_dx = ctx->needs_input_grad(0);
    const bool need_db = s.b_dtype && ctx->needs_input_grad(1 + count);
    // db from the cast-transpose's column partials where it runs on both outputs anyway.
    const bool db_from_cast = need_db && need_dx && need_dw && dy.is_cuda() && dy.scalar_type() == at::kBFloat16;
    at::Tensor partials;
    if (need_dx || need_dw) {
      const Fp8Casts dq = db_from_cast ? dy_codes_and_partials(dy, scale, amax, partials)
                                       : cast_slot(dy, scale, amax, kFp8Dy, Fp8Format::kE5M2, need_dx, need_dw,
                                                   "fp8_linear dy");
      if (need_dx) {  // dX [m, k] = dY [m, n] (W^T [k, n])^T
        out[0] = at::empty(s.x_sizes, dy.options());
        detail::fp8_linear_dx(dq.q, wq_t, scale_inv, out[0].view({m, k}));
      }
      if (need_dw) {  // dW [n, k] = dY^T [n, m] (x^T [k, m])^T
        const at::Tensor dw = detail::fp8_linear_dw(dq.q_t, xq_t, scale_inv, s.w_dtype);
        const std::vector<at::Tensor> blocks = count == 1 ? std::vector<at::Tensor>{dw} : detail::row_blocks(dw, rows);
        for (size_t i = 0; i < count; ++i)
          if (ctx->needs_input_grad(1 + i)) out[1 + i] = blocks[i];
      }
    }
    if (need_db) {
      out[1 + count] = at::empty({n}, dy.options().dtype(*s.b_dtype));
      if (db_from_cast) {
        batch_sums_into(partials, out[1 + count]);
      } else {
        column_sums_into({dy}, {out[1 + count]});
      }
    }
    return out;
  }
};

// x as [M, K] and its quantised values (reference).
at::Tensor dequantised(const at::Tensor& t, const Fp8Scaling& s, int slot, Fp8Format f) {
  const at::Tensor q = fp8_quantize_reference(t, s.scale.select(0, slot), f);
  return fp8_dequantize_reference(q, s.scale_inv.select(0, slot));
}

}  // namespace

Fp8Scaling make_fp8_linear_scaling(int64_t history_len, const at::Device& device) {
  return make_fp8_scaling({Fp8Format::kE4M3, Fp8Format::kE4M3, Fp8Format::kE5M2}, history_len, device);
}

bool fp8_linear_supported(const at::Tensor& x, const at::Tensor& weight) {
  return fp8_linear_supported(x, weight.size(0));
}

bool fp8_linear_supported(const at::Tensor& x, int64_t n) {
  if (!x.is_cuda()) return true;
  return detail::leading_rows(x) % 16 == 0 && x.size(-1) % 16 == 0 && n % 16 == 0;
}

at::Tensor fp8_linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias, const Fp8Scaling& state) {
  check_args(x, weight, bias, state);
  const std::optional<at::Tensor> b = bias.defined() ? std::optional<at::Tensor>(bias) : std::nullopt;
  return Fp8LinearFunction::apply(detail::grad_mode_input(x), at::TensorList(detail::grad_mode_input(weight)), b,
                                  state.amax, state.scale, state.scale_inv, std::nullopt, std::nullopt);
}

at::Tensor fp8_linear(const at::Tensor& x, const std::vector<at::Tensor>& weights, const Fp8Scaling& state) {
  check_args(x, weights, state);
  return Fp8LinearFunction::apply(detail::grad_mode_input(x), at::TensorList(detail::grad_mode_inputs(weights)),
                                  std::optional<at::Tensor>(), state.amax, state.scale, state.scale_inv, std::nullopt,
                                  std::nullopt);
}

at::Tensor fp8_linear(const Fp8Operand& x, const at::Tensor& weight, const at::Tensor& bias, const Fp8Scaling& state) {
  if (!x.codes.defined()) return fp8_linear(x.x, weight, bias, state);
  check_args(x.x, weight, bias, state);
  const at::Tensor codes = detail::checked_fp8_codes(x);
  const std::optional<at::Tensor> b = bias.defined() ? std::optional<at::Tensor>(bias) : std::nullopt;
  return Fp8LinearFunction::apply(detail::grad_mode_input(x.x), at::TensorList(detail::grad_mode_input(weight)), b,
                                  state.amax, state.scale, state.scale_inv, codes, detail::checked_fp8_codes_t(x));
}

at::Tensor fp8_linear(const Fp8Operand& x, const std::vector<at::Tensor>& weights, const Fp8Scaling& state) {
  if (!x.codes.defined()) return fp8_linear(x.x, weights, state);
  check_args(x.x, weights, state);
  const at::Tensor codes = detail::checked_fp8_codes(x);
  return Fp8LinearFunction::apply(detail::grad_mode_input(x.x), at::TensorList(detail::grad_mode_inputs(weights)),
                                  std::optional<at::Tensor>(), state.amax, state.scale, state.scale_inv, codes,
                                  detail::checked_fp8_codes_t(x));
}

Fp8Target fp8_linear_input_target(const Fp8Scaling& state) {
  return {state.scale.select(0, kFp8X), state.amax.select(0, kFp8X)};
}

at::Tensor fp8_linear_reference(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                                const Fp8Scaling& s) {
  const int64_t k = x.size(-1);
  const at::Tensor x2 = x.reshape({-1, k});
  at::Tensor y = at::mm(dequantised(x2, s, kFp8X, Fp8Format::kE4M3),
                        dequantised(weight, s, kFp8W, Fp8Format::kE4M3).t());
  if (bias.defined()) y = y + bias.to(at::kFloat);
  return y.reshape(with_last(x.sizes(), weight.size(0)));
}

Fp8LinearGrads fp8_linear_backward_reference(const at::Tensor& dy, const at::Tensor& x, const at::Tensor& weight,
                                             const Fp8Scaling& s) {
  const int64_t k = x.size(-1), n = weight.size(0);
  const at::Tensor dy2 = dy.reshape({-1, n}), x2 = x.reshape({-1, k});
  const at::Tensor dyd = dequantised(dy2, s, kFp8Dy, Fp8Format::kE5M2);
  Fp8LinearGrads g;
  g.dx = at::mm(dyd, dequantised(weight, s, kFp8W, Fp8Format::kE4M3)).reshape(x.sizes());
  g.dw = at::mm(dyd.t(), dequantised(x2, s, kFp8X, Fp8Format::kE4M3));
  g.db = dy2.to(at::kFloat).sum(0);
  return g;
}

}  // namespace perftrain::ops
