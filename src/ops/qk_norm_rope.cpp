#include "ops/qk_norm_rope.h"

#include <ATen/TensorOperators.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/rsqrt.h>
#include <ATen/ops/stack.h>
#include <ATen/ops/zeros_like.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/csrc/autograd/custom_function.h>

#include <array>
#include <cstdint>
#include <optional>
#include <string>

#include "base/error.h"
#include "kernels/qk_norm_rope.h"
#include "ops/column_sums.h"
#include "ops/compute_weights.h"
#include "ops/dtype_dispatch.h"
#include "ops/weight_grad_stream.h"

namespace perftrain::ops {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

namespace {

constexpr const char* kOp = "qk_norm_rope";

constexpr int64_t kMaxHeadDim = kernels::kQkNormRopeMaxHeadDim;

bool is_float_dtype(at::ScalarType t, bool allow_f64) { return is_kernel_dtype(t) || (allow_f64 && t == at::kDouble); }

// Every argument check, each failure a UsageError naming the op and the input.
// allow_f64: the reference also takes float64 (the tests' float64 references).
void check_args(const at::Tensor& qk, int64_t heads, const at::Tensor& q_weight, const at::Tensor& k_weight,
                const at::Tensor& cos, const at::Tensor& sin, double eps, bool allow_f64) {
  const std::string o(kOp);
  if (!qk.defined()) throw UsageError(o + ": qk must be a defined tensor");
  if (qk.dim() != 3 || qk.size(2) % 2 != 0 || qk.size(2) == 0)
    throw UsageError(o + ": qk must be [B, T, 2D] (q | k), got shape " + shape(qk));
  const int64_t d = qk.size(2) / 2;
  if (heads < 1 || d % heads != 0)
    throw UsageError(o + ": heads must be >= 1 and divide D = " + std::to_string(d) + ", got " + std::to_string(heads));
  const int64_t hd = d / heads, t = qk.size(1);
  if (hd % 2 != 0) throw UsageError(o + ": the head dimension D / heads must be even, got " + std::to_string(hd));
  if (!is_float_dtype(qk.scalar_type(), allow_f64))
    throw UsageError(o + ": qk must be float32, bfloat16 or float16, got " + c10::toString(qk.scalar_type()));
  if (!(eps >= 0)) throw UsageError(o + ": eps must be >= 0, got " + std::to_string(eps));
  auto same_device = [&](const at::Tensor& a, const char* name) {
    if (a.device() != qk.device())
      throw UsageError(o + ": qk is on " + qk.device().str() + " but " + name + " is on " + a.device().str());
  };
  for (const auto& [w, name] : {std::pair<const at::Tensor&, const char*>{q_weight, "q_weight"},
                                std::pair<const at::Tensor&, const char*>{k_weight, "k_weight"}}) {
    if (!w.defined()) continue;
    if (w.dim() != 1 || w.size(0) != hd)
      throw UsageError(o + ": " + name + " must be [" + std::to_string(hd) + "] (the head dimension), got " +
                       shape(w));
    if (!is_float_dtype(w.scalar_type(), true))
      throw UsageError(o + ": " + name + " must be float32, bfloat16, float16 or float64, got " +
                       c10::toString(w.scalar_type()));
    same_device(w, name);
  }
  for (const auto& [c, name] : {std::pair<const at::Tensor&, const char*>{cos, "cos"},
                                std::pair<const at::Tensor&, const char*>{sin, "sin"}}) {
    if (!c.defined()) throw UsageError(o + ": " + name + " must be a defined tensor");
    if (c.dim() != 2 || c.size(0) != t || c.size(1) != hd / 2)
      throw UsageError(o + ": " + name + " must be [T, hd/2] = [" + std::to_string(t) + ", " + std::to_string(hd / 2) +
                       "], got " + shape(c));
    if (c.scalar_type() != at::kFloat && !(allow_f64 && c.scalar_type() == at::kDouble))
      throw UsageError(o + ": " + name + " must be float32, got " + c10::toString(c.scalar_type()));
    same_device(c, name);
  }
  if (!qk.is_cuda() || allow_f64) return;
  if (hd > kMaxHeadDim)
    throw UsageError(o + ": head dimension " + std::to_string(hd) + " is wider than the CUDA kernel takes (" +
                     std::to_string(kMaxHeadDim) + ")");
  if (qk.numel() > INT32_MAX) throw UsageError(o + ": qk " + shape(qk) + " is too large for the CUDA kernel");
}


// The stride between t's rows [B * T] when its last dimension is contiguous
// and its rows evenly strided, else 0.
int64_t row_stride(const at::Tensor& t) {
  if (t.stride(2) != 1) return 0;
  if (t.size(0) > 1 && t.size(1) > 1 && t.stride(0) != t.size(1) * t.stride(1)) return 0;
  return t.size(1) > 1 ? t.stride(1) : t.size(0) > 1 ? t.stride(0) : t.size(2);
}

// Whether the kernels read t's rows in place: evenly strided, every row's
// start aligned to two elements (they move pairs in one word).
bool kernel_rows(const at::Tensor& t) {
  const int64_t rs = row_stride(t);
  const auto addr = reinterpret_cast<uintptr_t>(t.data_ptr());
  return rs != 0 && rs % 2 == 0 && addr % (2 * t.element_size()) == 0;
}

// t as the kernels read it: itself, or a dense pair-aligned copy.
at::Tensor kernel_operand(const at::Tensor& t) {
  if (kernel_rows(t)) return t;
  const at::Tensor c = t.contiguous();
  return kernel_rows(c) ? c : c.clone();
}

// The q | k halves of a [B, T, 2D] operand (as kernel_operand gives it) for the kernels.
template <typename T>
kernels::QkRows<T> qk_rows(const at::Tensor& t) {
  T* p = kernel_ptr<T>(t);
  return {p, p + t.size(2) / 2, row_stride(t)};
}

// The gradients of q and of k [B, T, D] as one QkRows operand: in place when
// both are kernel operands with one row stride, else dense copies (an
// undefined one as zeros).
template <typename T>
kernels::QkRows<const T> grad_rows(at::Tensor& dq, at::Tensor& dk, const at::Tensor& like) {
  if (!dq.defined()) dq = at::zeros_like(like);
  if (!dk.defined()) dk = at::zeros_like(like);
  if (!kernel_rows(dq) || !kernel_rows(dk) || row_stride(dq) != row_stride(dk)) {
    dq = kernel_operand(dq.contiguous());
    dk = kernel_operand(dk.contiguous());
  }
  return {kernel_ptr<const T>(dq), kernel_ptr<const T>(dk), row_stride(dq)};
}

// A weight as the kernels read it: dense fp32 (the master itself when it is
// one), or undefined.
at::Tensor kernel_weight(const std::optional<at::Tensor>& w) {
  return w.has_value() ? compute_weight(*w, at::kFloat) : at::Tensor();
}

// The weights travel as optionals: autograd functions take no undefined
// tensors. An absent optional is no input edge at all (libtorch's
// ExtractVariables skips it), so the edges are qk 0, cos 1, sin 2, then
// q_weight 3 when present, then k_weight (3 without a q weight, else 4);
// backward's result stays indexed by forward argument. Two outputs, q and k:
// views of one [B, T, 2D], each with its own incoming gradient.
struct QkNormRopeFunction : public torch::autograd::Function<QkNormRopeFunction> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& qk_in, const at::Tensor& cos_in,
                               const at::Tensor& sin_in, int64_t heads, double eps,
                               const std::optional<at::Tensor>& q_weight, const std::optional<at::Tensor>& k_weight) {
    const detail::QkNormRopeForward f = detail::qk_norm_rope_forward_cuda(
        qk_in, heads, q_weight.value_or(at::Tensor()), k_weight.value_or(at::Tensor()), cos_in, sin_in, eps);
    // The input, not the output: see the header.
    ctx->save_for_backward({f.qk, f.rstd, f.q_weight, f.k_weight, f.cos, f.sin});
    ctx->saved_data["heads"] = heads;
    ctx->saved_data["q_dtype"] = q_weight.has_value() ? int64_t(q_weight->scalar_type()) : int64_t(-1);
    ctx->saved_data["k_dtype"] = k_weight.has_value() ? int64_t(k_weight->scalar_type()) : int64_t(-1);
    const int64_t d = f.out.size(2) / 2;
    return {f.out.narrow(2, 0, d), f.out.narrow(2, d, d)};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    variable_list result(7);  // qk, cos, sin, heads, eps, q_weight, k_weight
    if (!grads[0].defined() && !grads[1].defined()) return result;
    const variable_list saved = ctx->get_saved_variables();
    const int64_t q_dtype = ctx->saved_data["q_dtype"].toInt(), k_dtype = ctx->saved_data["k_dtype"].toInt();
    const bool want_q = q_dtype >= 0 && ctx->needs_input_grad(3);
    const bool want_k = k_dtype >= 0 && ctx->needs_input_grad(q_dtype >= 0 ? 4 : 3);
    const auto dtype = [](bool want, int64_t d) {
      return want ? std::optional<at::ScalarType>(static_cast<at::ScalarType>(d)) : std::nullopt;
    };
    const detail::QkNormRopeGrads g = detail::qk_norm_rope_backward_cuda(
        grads[0], grads[1], saved[0], saved[1], saved[2], saved[3], saved[4], saved[5],
        ctx->saved_data["heads"].toInt(), ctx->needs_input_grad(0), dtype(want_q, q_dtype), dtype(want_k, k_dtype));
    result[0] = g.qk, result[5] = g.q_weight, result[6] = g.k_weight;
    return result;
  }
};

}  // namespace

namespace detail {

void check_qk_norm_rope_args(const at::Tensor& qk, int64_t heads, const at::Tensor& q_weight,
                             const at::Tensor& k_weight, const at::Tensor& cos, const at::Tensor& sin, double eps) {
  check_args(qk, heads, q_weight, k_weight, cos, sin, eps, /*allow_f64=*/false);
}

QkNormRopeForward qk_norm_rope_forward_cuda(const at::Tensor& qk_in, int64_t heads, const at::Tensor& q_weight,
                                            const at::Tensor& k_weight, const at::Tensor& cos_in,
                                            const at::Tensor& sin_in, double eps, const at::Tensor& out_in) {
  const c10::cuda::CUDAGuard guard(qk_in.device());
  const int rows = int(qk_in.size(0) * qk_in.size(1)), tokens = int(qk_in.size(1));
  const int hd = int(qk_in.size(2) / 2 / heads);
  const at::Tensor qk = kernel_operand(qk_in);
  const at::Tensor cos = cos_in.contiguous(), sin = sin_in.contiguous();
  const at::Tensor qw = kernel_weight(q_weight), kw = kernel_weight(k_weight);
  const at::Tensor out = out_in.defined() ? out_in : at::empty(qk.sizes(), qk.options());
  if (!kernel_rows(out)) throw RuntimeError(std::string(kOp) + ": out's rows are not evenly strided and pair-aligned");
  at::Tensor rstd = at::empty({qk.size(0), qk.size(1), 2, heads}, qk.options().dtype(at::kFloat));
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  with_kernel_type(kOp, qk.scalar_type(), [&](auto tp) {
    using T = kernel_type<decltype(tp)>;
    kernels::qk_norm_rope_forward<T>(qk_rows<const T>(qk), kernel_ptr<const float>(qw), kernel_ptr<const float>(kw),
                                     cos.data_ptr<float>(), sin.data_ptr<float>(), qk_rows<T>(out),
                                     rstd.data_ptr<float>(), rows, tokens, int(heads), hd, float(eps), stream);
  });
  return {out, qk, rstd, qw, kw, cos, sin};
}

namespace {

// The backward's weight gradients from the kernel's partials [2, tiles, hd],
// for the optimizer only: beside the rest of the backward (ops/weight_grad_stream.h).
void weight_grads_from_partials(const at::Tensor& partials, std::optional<at::ScalarType> q_dtype,
                                std::optional<at::ScalarType> k_dtype, QkNormRopeGrads& result) {
  const int64_t hd = partials.size(2);
  const at::TensorOptions f = partials.options();
  at::Tensor dq = q_dtype ? at::empty({hd}, f.dtype(*q_dtype)) : at::Tensor();
  at::Tensor dk = k_dtype ? at::empty({hd}, f.dtype(*k_dtype)) : at::Tensor();
  run_weight_grads(
      [partials, dq, dk] {
        if (dq.defined()) batch_sums_into(partials.select(0, 0), dq);
        if (dk.defined()) batch_sums_into(partials.select(0, 1), dk);
      },
      {partials});
  result.q_weight = dq, result.k_weight = dk;
}

}  // namespace

QkNormRopeGrads qk_norm_rope_backward_cuda(const at::Tensor& dq_in, const at::Tensor& dk_in, const at::Tensor& qk_in,
                                           const at::Tensor& rstd, const at::Tensor& q_weight,
                                           const at::Tensor& k_weight, const at::Tensor& cos_in,
                                           const at::Tensor& sin_in, int64_t heads, bool want_qk,
                                           std::optional<at::ScalarType> q_dtype,
                                           std::optional<at::ScalarType> k_dtype, const at::Tensor& dqk_out) {
  const bool want_q = q_dtype.has_value(), want_k = k_dtype.has_value();
  QkNormRopeGrads result;
  if (!want_qk && !want_q && !want_k) return result;
  const c10::cuda::CUDAGuard guard(qk_in.device());
  // As the forward read them (no copy where they already are: the saved ones).
  const at::Tensor qk = kernel_operand(qk_in), cos = cos_in.contiguous(), sin = sin_in.contiguous();
  const at::Tensor qw = q_weight.defined() ? compute_weight(q_weight, at::kFloat) : at::Tensor();
  const at::Tensor kw = k_weight.defined() ? compute_weight(k_weight, at::kFloat) : at::Tensor();
  const int rows = int(qk.size(0) * qk.size(1)), tokens = int(qk.size(1));
  const int64_t d = qk.size(2) / 2;
  const int hd = int(d / heads);
  const auto as_dtype = [&](const at::Tensor& g) { return g.defined() ? g.to(qk.scalar_type()) : g; };
  at::Tensor dq = as_dtype(dq_in), dk = as_dtype(dk_in);  // made kernel operands below, in place where they are
  const at::Tensor dqk = dqk_out.defined() ? dqk_out : at::empty(qk.sizes(), qk.options());
  if (!kernel_rows(dqk)) throw RuntimeError(std::string(kOp) + ": dqk's rows are not evenly strided and pair-aligned");
  const int tiles = kernels::qk_norm_rope_backward_tiles(
      rows, int(heads), at::cuda::getCurrentDeviceProperties()->multiProcessorCount);
  // Shape-determined scratch from the caching allocator: fine under graph capture.
  at::Tensor partials =
      want_q || want_k ? at::empty({2, tiles, hd}, qk.options().dtype(at::kFloat)) : at::Tensor();
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  with_kernel_type(kOp, qk.scalar_type(), [&](auto tp) {
    using T = kernel_type<decltype(tp)>;
    const kernels::QkRows<const T> g = grad_rows<T>(dq, dk, qk.narrow(2, 0, d));
    kernels::qk_norm_rope_backward<T>(g, qk_rows<const T>(qk), rstd.data_ptr<float>(), kernel_ptr<const float>(qw),
                                      kernel_ptr<const float>(kw), cos.data_ptr<float>(), sin.data_ptr<float>(),
                                      qk_rows<T>(dqk), kernel_ptr<float>(partials), rows, tokens, int(heads), hd,
                                      tiles, stream);
  });
  if (want_q || want_k) weight_grads_from_partials(partials, q_dtype, k_dtype, result);
  if (want_qk) result.qk = dqk;
  return result;
}

}  // namespace detail

std::array<at::Tensor, 2> qk_norm_rope_reference(const at::Tensor& qk, int64_t heads, const at::Tensor& q_weight,
                                                 const at::Tensor& k_weight, const at::Tensor& cos,
                                                 const at::Tensor& sin, double eps) {
  check_args(qk, heads, q_weight, k_weight, cos, sin, eps, /*allow_f64=*/true);
  auto f64 = [](const at::Tensor& a) { return a.defined() && a.scalar_type() == at::kDouble; };
  const at::ScalarType ct =
      f64(qk) || f64(q_weight) || f64(k_weight) || f64(cos) || f64(sin) ? at::kDouble : at::kFloat;
  const int64_t b = qk.size(0), t = qk.size(1), d = qk.size(2) / 2, hd = d / heads, half = hd / 2;
  const at::Tensor x = qk.to(ct).reshape({b, t, 2, heads, hd});
  const at::Tensor c = cos.to(ct).view({1, t, 1, half}), s = sin.to(ct).view({1, t, 1, half});
  auto norm_rope = [&](const at::Tensor& p, const at::Tensor& w) {  // p [B, T, H, hd]
    at::Tensor n = p * at::rsqrt(p.pow(2).mean(-1, /*keepdim=*/true) + eps);
    if (w.defined()) n = n * w.to(ct);
    const at::Tensor pairs = n.reshape({b, t, heads, half, 2});
    const at::Tensor x0 = pairs.select(-1, 0), x1 = pairs.select(-1, 1);
    return at::stack({x0 * c - x1 * s, x0 * s + x1 * c}, -1).reshape({b, t, d}).to(qk.scalar_type());
  };
  return {norm_rope(x.select(2, 0), q_weight), norm_rope(x.select(2, 1), k_weight)};
}

std::array<at::Tensor, 2> qk_norm_rope(const at::Tensor& qk, int64_t heads, const at::Tensor& q_weight,
                                       const at::Tensor& k_weight, const at::Tensor& cos, const at::Tensor& sin,
                                       double eps) {
  check_args(qk, heads, q_weight, k_weight, cos, sin, eps, /*allow_f64=*/false);
  if (!qk.is_cuda() || qk.numel() == 0) return qk_norm_rope_reference(qk, heads, q_weight, k_weight, cos, sin, eps);
  auto opt = [](const at::Tensor& w) { return w.defined() ? std::optional<at::Tensor>(w) : std::nullopt; };
  const variable_list qk_out = QkNormRopeFunction::apply(qk, cos, sin, heads, eps, opt(q_weight), opt(k_weight));
  return {qk_out[0], qk_out[1]};
}

}  // namespace perftrain::ops
