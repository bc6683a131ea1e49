// The residual updates as PyTorch operators: gated_residual, residual_adaln
// and residual_rms_adaln, each a forward op and a `<op>_backward` op
// (python/perftrain/ops.py joins them with torch.library.register_autograd
// and gives each a fake implementation). Forward: the C++ op (the CUDA
// kernels; the reference on the CPU). Backward: gated_residual's and
// residual_adaln's and residual_rms_adaln's own CUDA backward
// (ops::detail::<op>_backward_cuda); autograd through the reference on the CPU.
#include <ATen/ops/zeros.h>
#include <ATen/core/grad_mode.h>
#include <torch/library.h>

#include "op_support.h"
#include "ops/compute_weights.h"
#include "ops/gated_residual.h"
#include "ops/residual_adaln.h"
#include "ops/residual_rms_adaln.h"
#include "ops/row_norm_op.h"

namespace perftrain::python {
namespace {

at::Tensor gated_residual(const at::Tensor& x, const at::Tensor& gate, const at::Tensor& y,
                          const std::optional<at::Tensor>& bias) {
  const at::NoGradGuard no_grad;  // autograd is recorded in Python (ops.py)
  return ops::gated_residual(x, gate, y, value_or_undefined(bias));
}

// Returns (dgate, dy, dbias; [0] without a bias). dx is the incoming gradient itself.
std::tuple<at::Tensor, at::Tensor, at::Tensor> gated_residual_backward_cpu(const at::Tensor& grad,
                                                                           const at::Tensor& gate,
                                                                           const at::Tensor& y,
                                                                           const std::optional<at::Tensor>& bias,
                                                                           at::ScalarType x_dtype) {
  // The gradients of gate, y and bias do not depend on x's values.
  const at::Tensor x = at::zeros({1, 1, 1}, y.options().dtype(x_dtype)).expand(y.sizes());
  const Tensors g = grads_through(
      [](const Tensors& in) { return Tensors{ops::gated_residual_reference(in[0], in[1], in[2], in[3])}; },
      {x, gate, y, value_or_undefined(bias)}, {grad});
  return {g[1], g[2], grad_or_slot(g[3], y)};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> gated_residual_backward_cuda(const at::Tensor& grad,
                                                                            const at::Tensor& gate,
                                                                            const at::Tensor& y,
                                                                            const std::optional<at::Tensor>& bias,
                                                                            at::ScalarType x_dtype) {
  const std::optional<at::ScalarType> bias_dtype =
      bias.has_value() ? std::optional<at::ScalarType>(bias->scalar_type()) : std::nullopt;
  const ops::detail::GatedResidualGrads g = ops::detail::gated_residual_backward_cuda(
      grad, gate, y, value_or_undefined(bias), x_dtype, true, true, bias_dtype);
  return {g.gate, g.y, grad_or_slot(g.bias, y)};
}

// (x1, h, xhat, mean, rstd): besides the outputs, what the CUDA backward
// reads (ops::detail::ResidualAdaLNForward): xhat where the op keeps it
// (CUDA, y and h 16-bit, x float32), else an empty [0] float32; the per-row
// float32 mean and rstd [B*T] (zeros on the CPU, whose backward goes through
// the reference).
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> residual_adaln(
    const at::Tensor& x, const at::Tensor& gate, const at::Tensor& y, const at::Tensor& shift,
    const at::Tensor& scale, const std::optional<at::Tensor>& bias, at::ScalarType out_dtype, double eps) {
  const at::NoGradGuard no_grad;
  ops::detail::check_residual_adaln_args(x, gate, y, shift, scale, out_dtype, value_or_undefined(bias));
  if (x.is_cuda()) {
    const ops::detail::ResidualAdaLNForward f = ops::detail::residual_adaln_forward_cuda(
        x, gate, y, shift, scale, out_dtype, eps, value_or_undefined(bias));
    return {f.x1, f.h, f.xhat.defined() ? f.xhat : no_grad_slot(x), f.mean, f.rstd};
  }
  auto [x1, h] = ops::residual_adaln_reference(x, gate, y, shift, scale, out_dtype, eps, value_or_undefined(bias));
  const at::TensorOptions f32 = x.options().dtype(at::kFloat);
  const int64_t rows = x.size(0) * x.size(1);
  return {x1, h, no_grad_slot(x), at::zeros({rows}, f32), at::zeros({rows}, f32)};
}

// (dx, dgate, dy, dshift, dscale, dbias; [0] without a bias). CUDA: the op's
// backward kernels (ops::detail::residual_adaln_backward_cuda) on what the
// forward kept, x1 read only without xhat (x is not kept: its dtype comes
// alone); CPU: autograd through the reference (x given).
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> residual_adaln_backward(
    const at::Tensor& grad_x1, const at::Tensor& grad_h, const std::optional<at::Tensor>& x, const at::Tensor& gate,
    const at::Tensor& y, const at::Tensor& shift, const at::Tensor& scale, const std::optional<at::Tensor>& bias,
    const std::optional<at::Tensor>& x1, const at::Tensor& xhat, const at::Tensor& mean, const at::Tensor& rstd,
    at::ScalarType x_dtype, at::ScalarType out_dtype, double eps) {
  const at::Tensor b = value_or_undefined(bias);
  if (!y.is_cuda()) {
    c10::List<std::optional<at::Tensor>> inputs;
    for (const at::Tensor& t : {value_or_undefined(x), gate, y, shift, scale, b}) inputs.push_back(t);
    const Tensors g = backward_through(
        [&](const Tensors& in) {
          auto [o1, o2] = ops::residual_adaln_reference(in[0], in[1], in[2], in[3], in[4], out_dtype, eps, in[5]);
          return Tensors{o1, o2};
        },
        {grad_x1, grad_h}, inputs);
    return {g[0], g[1], g[2], g[3], g[4], g[5]};
  }
  // What the forward kept, as it kept it (no copy where the inputs already are).
  ops::detail::ResidualAdaLNForward saved;
  const std::vector<at::Tensor> mod = ops::detail::per_sample_rows({gate, shift, scale});
  saved.act = y.scalar_type() == out_dtype ? out_dtype : at::kFloat;
  saved.y = y.to(saved.act).contiguous(), saved.gate = mod[0], saved.scale = mod[2];
  saved.bias = b.defined() ? b.to(at::kFloat).contiguous() : at::Tensor();
  saved.xhat = xhat.numel() > 0 ? xhat : at::Tensor();
  saved.x1 = saved.xhat.defined() ? at::Tensor() : value_or_undefined(x1);
  saved.mean = mean, saved.rstd = rstd;
  const ops::detail::ResidualAdaLNDtypes dtypes{
      x_dtype,          gate.scalar_type(), y.scalar_type(), shift.scalar_type(), scale.scalar_type(),
      b.defined() ? std::optional<at::ScalarType>(b.scalar_type()) : std::nullopt};
  const ops::detail::ResidualAdaLNGrads g = ops::detail::residual_adaln_backward_cuda(
      grad_x1, grad_h, saved, dtypes, {true, true, true, true, true, b.defined()});
  return {g.x, g.gate, g.y, g.shift, g.scale, grad_or_slot(g.bias, y)};
}

// (x1, h, xhat, y_rstd, rstd): besides the outputs, what the CUDA backward
// reads (ops::detail::ResidualRmsAdaLNForward), as residual_adaln's.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> residual_rms_adaln(
    const at::Tensor& x, const at::Tensor& gate, const at::Tensor& y, const std::optional<at::Tensor>& post_weight,
    const std::optional<at::Tensor>& pre_weight, const std::optional<at::Tensor>& scale, at::ScalarType out_dtype,
    double eps) {
  const at::NoGradGuard no_grad;
  const at::Tensor post = value_or_undefined(post_weight), pre = value_or_undefined(pre_weight),
                   sc = value_or_undefined(scale);
  ops::detail::check_residual_rms_adaln_args(x, gate, y, post, pre, sc, out_dtype);
  if (x.is_cuda()) {
    const ops::detail::ResidualRmsAdaLNForward f =
        ops::detail::residual_rms_adaln_forward_cuda(x, gate, y, post, pre, sc, out_dtype, eps);
    return {f.x1, f.h, f.xhat.defined() ? f.xhat : no_grad_slot(x), f.y_rstd, f.rstd};
  }
  auto [x1, h] = ops::residual_rms_adaln_reference(x, gate, y, post, pre, sc, out_dtype, eps);
  const at::TensorOptions f32 = x.options().dtype(at::kFloat);
  const int64_t rows = x.size(0) * x.size(1);
  return {x1, h, no_grad_slot(x), at::zeros({rows}, f32), at::zeros({rows}, f32)};
}

// (dx, dgate, dy, dpost_weight, dpre_weight, dscale; [0] for an absent one).
// CUDA: the op's backward kernels (ops::detail::residual_rms_adaln_backward_cuda)
// on what the forward kept (x1 only without xhat; x not kept); CPU: autograd
// through the reference (x given).
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> residual_rms_adaln_backward(
    const at::Tensor& grad_x1, const at::Tensor& grad_h, const std::optional<at::Tensor>& x, const at::Tensor& gate,
    const at::Tensor& y, const std::optional<at::Tensor>& post_weight, const std::optional<at::Tensor>& pre_weight,
    const std::optional<at::Tensor>& scale, const std::optional<at::Tensor>& x1, const at::Tensor& xhat,
    const at::Tensor& y_rstd, const at::Tensor& rstd, at::ScalarType x_dtype, at::ScalarType out_dtype, double eps) {
  const at::Tensor post = value_or_undefined(post_weight), pre = value_or_undefined(pre_weight),
                   sc = value_or_undefined(scale);
  if (!y.is_cuda()) {
    c10::List<std::optional<at::Tensor>> inputs;
    for (const auto& t : {x, std::optional<at::Tensor>(gate), std::optional<at::Tensor>(y), post_weight, pre_weight,
                          scale})
      inputs.push_back(t);
    const Tensors g = backward_through(
        [&](const Tensors& in) {
          auto [o1, o2] = ops::residual_rms_adaln_reference(in[0], in[1], in[2], in[3], in[4], in[5], out_dtype, eps);
          return Tensors{o1, o2};
        },
        {grad_x1, grad_h}, inputs);
    return {g[0], g[1], g[2], g[3], g[4], g[5]};
  }
  // What the forward kept, as it kept it (no copy where the inputs already are).
  ops::detail::ResidualRmsAdaLNForward saved;
  const std::vector<at::Tensor> mod = ops::detail::per_sample_rows({gate, sc});
  saved.act = y.scalar_type() == out_dtype ? out_dtype : at::kFloat;
  saved.y = y.to(saved.act).contiguous(), saved.gate = mod[0], saved.scale = mod[1];
  const auto dense_f32 = [](const at::Tensor& w) {
    return w.defined() ? ops::compute_weight(w, at::kFloat) : at::Tensor();
  };
  saved.post_weight = dense_f32(post), saved.pre_weight = dense_f32(pre);
  saved.xhat = xhat.numel() > 0 ? xhat : at::Tensor();
  saved.x1 = saved.xhat.defined() ? at::Tensor() : value_or_undefined(x1);
  saved.y_rstd = y_rstd, saved.rstd = rstd;
  const auto dtype_of = [](const at::Tensor& t) {
    return t.defined() ? std::optional<at::ScalarType>(t.scalar_type()) : std::nullopt;
  };
  const ops::detail::ResidualRmsAdaLNDtypes dtypes{x_dtype,         gate.scalar_type(), y.scalar_type(),
                                                   dtype_of(post), dtype_of(pre),      dtype_of(sc)};
  const ops::detail::ResidualRmsAdaLNGrads g = ops::detail::residual_rms_adaln_backward_cuda(
      grad_x1, grad_h, saved, dtypes, {true, true, true, post.defined(), pre.defined(), sc.defined()});
  return {g.x, g.gate, g.y, grad_or_slot(g.post_weight, y), grad_or_slot(g.pre_weight, y), grad_or_slot(g.scale, y)};
}

}  // namespace
}  // namespace perftrain::python

TORCH_LIBRARY_FRAGMENT(perftrain, m) {
  m.def("gated_residual(Tensor x, Tensor gate, Tensor y, Tensor? bias=None) -> Tensor");
  m.def("gated_residual_backward(Tensor grad, Tensor gate, Tensor y, Tensor? bias, ScalarType x_dtype)"
        " -> (Tensor, Tensor, Tensor)");
  m.def("residual_adaln(Tensor x, Tensor gate, Tensor y, Tensor shift, Tensor scale, Tensor? bias,"
        " ScalarType out_dtype, float eps) -> (Tensor, Tensor, Tensor, Tensor, Tensor)");
  m.def("residual_adaln_backward(Tensor grad_x1, Tensor grad_h, Tensor? x, Tensor gate, Tensor y, Tensor shift,"
        " Tensor scale, Tensor? bias, Tensor? x1, Tensor xhat, Tensor mean, Tensor rstd, ScalarType x_dtype,"
        " ScalarType out_dtype, float eps) -> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)");
  m.def("residual_rms_adaln(Tensor x, Tensor gate, Tensor y, Tensor? post_weight, Tensor? pre_weight,"
        " Tensor? scale, ScalarType out_dtype, float eps) -> (Tensor, Tensor, Tensor, Tensor, Tensor)");
  m.def("residual_rms_adaln_backward(Tensor grad_x1, Tensor grad_h, Tensor? x, Tensor gate, Tensor y,"
        " Tensor? post_weight, Tensor? pre_weight, Tensor? scale, Tensor? x1, Tensor xhat, Tensor y_rstd,"
        " Tensor rstd, ScalarType x_dtype, ScalarType out_dtype, float eps)"
        " -> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)");
}

// The kernels CPU and CUDA share (each picks its path by device); gated_residual's backward differs.
static void register_residual_kernels(torch::Library& m) {
  m.impl("gated_residual", perftrain::python::kernel<&perftrain::python::gated_residual>);
  m.impl("residual_adaln", perftrain::python::kernel<&perftrain::python::residual_adaln>);
  m.impl("residual_adaln_backward", perftrain::python::kernel<&perftrain::python::residual_adaln_backward>);
  m.impl("residual_rms_adaln", perftrain::python::kernel<&perftrain::python::residual_rms_adaln>);
  m.impl("residual_rms_adaln_backward", perftrain::python::kernel<&perftrain::python::residual_rms_adaln_backward>);
}

TORCH_LIBRARY_IMPL(perftrain, CPU, m) {
  register_residual_kernels(m);
  m.impl("gated_residual_backward", perftrain::python::kernel<&perftrain::python::gated_residual_backward_cpu>);
}

TORCH_LIBRARY_IMPL(perftrain, CUDA, m) {
  register_residual_kernels(m);
  m.impl("gated_residual_backward", perftrain::python::kernel<&perftrain::python::gated_residual_backward_cuda>);
}
