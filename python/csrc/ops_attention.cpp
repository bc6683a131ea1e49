// Attention pieces as PyTorch operators: qk_norm_rope (the single-stream
// blocks' QK-norm and rotary embedding on the packed qkv; its own CUDA
// backward) and attention (softmax attention of a packed qkv; our whole-head
// kernels, tiled kernels or cuDNN's, with a key mask or not, as the C++
// trainer chooses them: ops/qkv_attention.h). Forward and
// `<op>_backward` ops, joined in python/perftrain/ops.py.
#include <ATen/core/grad_mode.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <torch/library.h>

#include "base/error.h"
#include "op_support.h"
#include "ops/qk_norm_rope.h"
#include "ops/qkv_attention.h"
#include "ops/self_attention.h"

namespace perftrain::python {
namespace {

// qkv [B, T, 3D] (q | k | v) as the op's argument, else UsageError.
void check_packed(const at::Tensor& qkv) {
  if (!qkv.defined() || qkv.dim() != 3 || qkv.size(2) % 3 != 0 || qkv.size(2) == 0)
    throw UsageError("qk_norm_rope: qkv must be [B, T, 3D] (q | k | v), got " +
                     (qkv.defined() ? c10::str(qkv.sizes()) : std::string("an undefined tensor")));
}

// The q | k and v column blocks of a packed [B, T, 3D].
at::Tensor qk_of(const at::Tensor& t) { return t.narrow(2, 0, t.size(2) / 3 * 2); }
at::Tensor v_of(const at::Tensor& t) { return t.narrow(2, t.size(2) / 3 * 2, t.size(2) / 3); }

// (out, rstd) on the packed qkv [B, T, 3D] -> [B, T, 3D] (v copied: this op
// keeps the packed form the Python attention op reads); rstd [B, T, 2, heads]
// float32 is what the CUDA backward reads (zeros on the CPU, whose backward
// goes through the reference).
std::tuple<at::Tensor, at::Tensor> qk_norm_rope(const at::Tensor& qkv, const std::optional<at::Tensor>& q_weight,
                                                const std::optional<at::Tensor>& k_weight, const at::Tensor& cos,
                                                const at::Tensor& sin, int64_t heads, double eps) {
  const at::NoGradGuard no_grad;  // autograd is recorded in Python (ops.py)
  const at::Tensor qw = value_or_undefined(q_weight), kw = value_or_undefined(k_weight);
  check_packed(qkv);
  ops::detail::check_qk_norm_rope_args(qk_of(qkv), heads, qw, kw, cos, sin, eps);
  if (qkv.is_cuda() && qkv.numel() > 0) {
    const at::Tensor out = at::empty(qkv.sizes(), qkv.options());  // pair-aligned rows: 3D is even
    const ops::detail::QkNormRopeForward f =
        ops::detail::qk_norm_rope_forward_cuda(qk_of(qkv), heads, qw, kw, cos, sin, eps, qk_of(out));
    v_of(out).copy_(v_of(qkv));
    return {out, f.rstd};
  }
  const auto [q, k] = ops::qk_norm_rope_reference(qk_of(qkv), heads, qw, kw, cos, sin, eps);
  return {at::cat({q, k, v_of(qkv)}, 2),
          at::zeros({qkv.size(0), qkv.size(1), 2, heads}, qkv.options().dtype(at::kFloat))};
}

// (dqkv, dq_weight, dk_weight; [0] for an absent weight). CUDA: the op's
// backward kernels (ops::detail::qk_norm_rope_backward_cuda) on the packed
// gradient's q and k blocks, its v block copied; CPU: autograd through the
// reference.
std::tuple<at::Tensor, at::Tensor, at::Tensor> qk_norm_rope_backward(
    const at::Tensor& grad, const at::Tensor& qkv, const std::optional<at::Tensor>& q_weight,
    const std::optional<at::Tensor>& k_weight, const at::Tensor& cos, const at::Tensor& sin, const at::Tensor& rstd,
    int64_t heads, double eps) {
  const at::Tensor qw = value_or_undefined(q_weight), kw = value_or_undefined(k_weight);
  if (qkv.is_cuda() && qkv.numel() > 0) {
    const auto dtype_of = [](const at::Tensor& t) {
      return t.defined() ? std::optional<at::ScalarType>(t.scalar_type()) : std::nullopt;
    };
    const int64_t d = qkv.size(2) / 3;
    const at::Tensor dqkv = at::empty(qkv.sizes(), qkv.options());
    const ops::detail::QkNormRopeGrads g = ops::detail::qk_norm_rope_backward_cuda(
        grad.narrow(2, 0, d), grad.narrow(2, d, d), qk_of(qkv), rstd, qw, kw, cos, sin, heads, /*want_qk=*/true,
        dtype_of(qw), dtype_of(kw), qk_of(dqkv));
    v_of(dqkv).copy_(v_of(grad));
    return {dqkv, grad_or_slot(g.q_weight, qkv), grad_or_slot(g.k_weight, qkv)};
  }
  c10::List<std::optional<at::Tensor>> inputs;
  for (const auto& t : {std::optional<at::Tensor>(qkv), q_weight, k_weight}) inputs.push_back(t);
  const Tensors g = backward_through(
      [&](const Tensors& in) {
        const auto [q, k] = ops::qk_norm_rope_reference(qk_of(in[0]), heads, in[1], in[2], cos, sin, eps);
        return Tensors{at::cat({q, k, v_of(in[0])}, 2)};
      },
      {grad}, inputs);
  return {g[0], g[1], g[2]};
}

// (out [B, T, D], lse [B, H, T] fp32) and the packed gradient: the C++
// trainer's choice of kernels for a packed qkv (ops::qkv_attention_forward
// and _backward: our whole-head or tiled kernels, cuDNN's, "auto"'s plan per
// shape; ATen's SDPA on the CPU), key mask or not.
std::tuple<at::Tensor, at::Tensor> attention(const at::Tensor& qkv, int64_t heads,
                                             const std::optional<at::Tensor>& key_mask) {
  return ops::qkv_attention_forward(qkv, heads, value_or_undefined(key_mask));
}

// Where ATen's SDPA ran the forward (the CPU), autograd through it on a
// recomputed forward.
at::Tensor attention_backward(const at::Tensor& grad, const at::Tensor& qkv, const at::Tensor& out,
                              const at::Tensor& lse, int64_t heads, const std::optional<at::Tensor>& key_mask) {
  const at::Tensor mask = value_or_undefined(key_mask);
  if (at::Tensor dqkv = ops::qkv_attention_backward(grad, qkv, heads, mask, out, lse); dqkv.defined()) return dqkv;
  c10::List<std::optional<at::Tensor>> inputs;
  inputs.push_back(qkv);
  const at::Tensor mask4 = mask.defined() ? mask.reshape({mask.size(0), 1, 1, mask.size(-1)}) : mask;
  return backward_through([&](const Tensors& in) { return Tensors{ops::self_attention(in[0], heads, mask4)}; },
                          {grad}, inputs)[0];
}

}  // namespace
}  // namespace perftrain::python

TORCH_LIBRARY_FRAGMENT(perftrain, m) {
  m.def("qk_norm_rope(Tensor qkv, Tensor? q_weight, Tensor? k_weight, Tensor cos, Tensor sin, int heads,"
        " float eps) -> (Tensor, Tensor)");
  m.def("qk_norm_rope_backward(Tensor grad, Tensor qkv, Tensor? q_weight, Tensor? k_weight, Tensor cos, Tensor sin,"
        " Tensor rstd, int heads, float eps) -> (Tensor, Tensor, Tensor)");
  m.def("attention(Tensor qkv, int heads, Tensor? key_mask=None) -> (Tensor, Tensor)");
  m.def("attention_backward(Tensor grad, Tensor qkv, Tensor out, Tensor lse, int heads, Tensor? key_mask=None)"
        " -> Tensor");
}

// The same kernels for CPU and CUDA (each kernel picks its path by device).
static void register_attention_kernels(torch::Library& m) {
  m.impl("qk_norm_rope", perftrain::python::kernel<&perftrain::python::qk_norm_rope>);
  m.impl("qk_norm_rope_backward", perftrain::python::kernel<&perftrain::python::qk_norm_rope_backward>);
  m.impl("attention", perftrain::python::kernel<&perftrain::python::attention>);
  m.impl("attention_backward", perftrain::python::kernel<&perftrain::python::attention_backward>);
}

TORCH_LIBRARY_IMPL(perftrain, CPU, m) { register_attention_kernels(m); }

TORCH_LIBRARY_IMPL(perftrain, CUDA, m) { register_attention_kernels(m); }
