// The row norms with adaLN modulation as PyTorch operators: adaln_layernorm
// and rms_adaln (src/ops/), each a forward op and a `<op>_backward` op
// (python/perftrain/ops.py joins them with register_autograd). Forward: the
// C++ op's (CUDA kernels; its reference on the CPU). Backward: each op's own
// CUDA backward (ops::detail::<op>_backward_cuda); the CPU's through the
// reference.
#include <ATen/core/grad_mode.h>
#include <ATen/ops/zeros.h>
#include <torch/library.h>

#include "op_support.h"
#include "ops/compute_weights.h"
#include "ops/adaln_layernorm.h"
#include "ops/rms_adaln.h"
#include "ops/row_norm_op.h"

namespace perftrain::python {
namespace {

// (h, mean, rstd): the per-row fp32 statistics [B*T] are what the CUDA
// backward reads (zeros on the CPU, whose backward goes through the reference).
std::tuple<at::Tensor, at::Tensor, at::Tensor> adaln_layernorm(const at::Tensor& x, const at::Tensor& shift,
                                                               const at::Tensor& scale, at::ScalarType out_dtype,
                                                               double eps) {
  const at::NoGradGuard no_grad;  // autograd is recorded in Python (ops.py)
  ops::detail::check_adaln_layernorm_args(x, shift, scale, out_dtype);
  if (x.is_cuda()) {
    const ops::detail::AdaLNLayerNormForward f = ops::detail::adaln_layernorm_forward_cuda(x, shift, scale, out_dtype, eps);
    return {f.h, f.mean, f.rstd};
  }
  const at::TensorOptions f32 = x.options().dtype(at::kFloat);
  const int64_t rows = x.size(0) * x.size(1);
  return {ops::adaln_layernorm_reference(x, shift, scale, out_dtype, eps), at::zeros({rows}, f32),
          at::zeros({rows}, f32)};
}

// CUDA: the op's backward kernels (ops::detail::adaln_layernorm_backward_cuda);
// CPU: autograd through the reference.
std::tuple<at::Tensor, at::Tensor, at::Tensor> adaln_layernorm_backward(
    const at::Tensor& grad, const at::Tensor& x, const at::Tensor& shift, const at::Tensor& scale,
    const at::Tensor& mean, const at::Tensor& rstd, at::ScalarType out_dtype, double eps) {
  if (x.is_cuda()) {
    // x and scale as the forward's kernels read them (no copy where they already are).
    const at::Tensor scale_rows = ops::detail::per_sample_rows({shift, scale})[1];
    const ops::detail::AdaLNLayerNormGrads g = ops::detail::adaln_layernorm_backward_cuda(
        grad, x.contiguous(), scale_rows, mean, rstd, out_dtype, shift.scalar_type(), scale.scalar_type());
    return {g.x, g.shift, g.scale};
  }
  c10::List<std::optional<at::Tensor>> inputs;
  for (const at::Tensor& t : {x, shift, scale}) inputs.push_back(t);
  const Tensors g = backward_through(
      [&](const Tensors& in) { return Tensors{ops::adaln_layernorm_reference(in[0], in[1], in[2], out_dtype, eps)}; },
      {grad}, inputs);
  return {g[0], g[1], g[2]};
}

// (h, xhat, rstd): besides h, what the CUDA backward reads
// (ops::detail::RmsAdaLNForward): xhat where the op keeps it (CUDA, h 16-bit,
// x float32), else an empty [0] float32, and the per-row float32 rstd [B*T]
// (zeros on the CPU, whose backward goes through the reference).
std::tuple<at::Tensor, at::Tensor, at::Tensor> rms_adaln(const at::Tensor& x, const std::optional<at::Tensor>& weight,
                                                         const std::optional<at::Tensor>& scale,
                                                         at::ScalarType out_dtype, double eps) {
  const at::NoGradGuard no_grad;
  const at::Tensor w = value_or_undefined(weight), sc = value_or_undefined(scale);
  ops::detail::check_rms_adaln_args(x, w, sc, out_dtype);
  if (x.is_cuda()) {
    const ops::detail::RmsAdaLNForward f = ops::detail::rms_adaln_forward_cuda(x, w, sc, out_dtype, eps);
    return {f.h, f.xhat.defined() ? f.xhat : no_grad_slot(x), f.rstd};
  }
  return {ops::rms_adaln_reference(x, w, sc, out_dtype, eps), no_grad_slot(x),
          at::zeros({x.size(0) * x.size(1)}, x.options().dtype(at::kFloat))};
}

// (dx, dweight, dscale; [0] for an absent one). CUDA: the op's backward
// kernels (ops::detail::rms_adaln_backward_cuda) on what the forward kept (x
// only without xhat); CPU: autograd through the reference.
std::tuple<at::Tensor, at::Tensor, at::Tensor> rms_adaln_backward(
    const at::Tensor& grad, const std::optional<at::Tensor>& x, const std::optional<at::Tensor>& weight,
    const std::optional<at::Tensor>& scale, const at::Tensor& xhat, const at::Tensor& rstd, at::ScalarType x_dtype,
    at::ScalarType out_dtype, double eps) {
  const at::Tensor w = value_or_undefined(weight), sc = value_or_undefined(scale);
  if (!grad.is_cuda()) {
    c10::List<std::optional<at::Tensor>> inputs;
    for (const auto& t : {x, weight, scale}) inputs.push_back(t);
    const Tensors g = backward_through(
        [&](const Tensors& in) { return Tensors{ops::rms_adaln_reference(in[0], in[1], in[2], out_dtype, eps)}; },
        {grad}, inputs);
    return {g[0], g[1], g[2]};
  }
  // What the forward kept, as it kept it (no copy where the inputs already are).
  ops::detail::RmsAdaLNForward saved;
  saved.xhat = xhat.numel() > 0 ? xhat : at::Tensor();
  saved.x = saved.xhat.defined() ? at::Tensor() : value_or_undefined(x).contiguous();
  saved.weight = w.defined() ? ops::compute_weight(w, at::kFloat) : at::Tensor();
  saved.scale = ops::detail::per_sample_rows({sc})[0];
  saved.rstd = rstd;
  const auto dtype_of = [](const at::Tensor& t) {
    return t.defined() ? std::optional<at::ScalarType>(t.scalar_type()) : std::nullopt;
  };
  const ops::detail::RmsAdaLNGrads g =
      ops::detail::rms_adaln_backward_cuda(grad, saved, out_dtype, x_dtype, dtype_of(w), dtype_of(sc));
  return {g.x, grad_or_slot(g.weight, grad), grad_or_slot(g.scale, grad)};
}

}  // namespace
}  // namespace perftrain::python

TORCH_LIBRARY_FRAGMENT(perftrain, m) {
  m.def("adaln_layernorm(Tensor x, Tensor shift, Tensor scale, ScalarType out_dtype, float eps)"
        " -> (Tensor, Tensor, Tensor)");
  m.def("adaln_layernorm_backward(Tensor grad, Tensor x, Tensor shift, Tensor scale, Tensor mean, Tensor rstd,"
        " ScalarType out_dtype, float eps) -> (Tensor, Tensor, Tensor)");
  m.def("rms_adaln(Tensor x, Tensor? weight, Tensor? scale, ScalarType out_dtype, float eps)"
        " -> (Tensor, Tensor, Tensor)");
  m.def("rms_adaln_backward(Tensor grad, Tensor? x, Tensor? weight, Tensor? scale, Tensor xhat, Tensor rstd,"
        " ScalarType x_dtype, ScalarType out_dtype, float eps) -> (Tensor, Tensor, Tensor)");
}

// The same kernels for CPU and CUDA (each kernel picks its path by device).
static void register_norm_kernels(torch::Library& m) {
  m.impl("adaln_layernorm", perftrain::python::kernel<&perftrain::python::adaln_layernorm>);
  m.impl("adaln_layernorm_backward", perftrain::python::kernel<&perftrain::python::adaln_layernorm_backward>);
  m.impl("rms_adaln", perftrain::python::kernel<&perftrain::python::rms_adaln>);
  m.impl("rms_adaln_backward", perftrain::python::kernel<&perftrain::python::rms_adaln_backward>);
}

TORCH_LIBRARY_IMPL(perftrain, CPU, m) { register_norm_kernels(m); }

TORCH_LIBRARY_IMPL(perftrain, CUDA, m) { register_norm_kernels(m); }
