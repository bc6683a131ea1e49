// Attention pieces as PyTorch operators: qk_norm_rope (the single-stream
// blocks' QK-norm and rotary embedding on the packed qkv) and attention
// (softmax attention of a packed qkv; our whole-head kernels forward and
// backward where they apply). Forward and `<op>_backward` ops, joined in
// python/perftrain/ops.py.
#include <ATen/core/grad_mode.h>
#include <ATen/ops/zeros.h>
#include <torch/library.h>

#include "op_support.h"
#include "ops/attention_head_bwd.h"
#include "ops/attention_head_fwd.h"
#include "ops/qk_norm_rope.h"
#include "ops/qkv_attention.h"

namespace perftrain::python {
namespace {

at::Tensor qk_norm_rope(const at::Tensor& qkv, const std::optional<at::Tensor>& q_weight,
                        const std::optional<at::Tensor>& k_weight, const at::Tensor& cos, const at::Tensor& sin,
                        int64_t heads, double eps) {
  const at::NoGradGuard no_grad;  // autograd is recorded in Python (ops.py)
  return ops::qk_norm_rope(qkv, heads, value_or_undefined(q_weight), value_or_undefined(k_weight), cos, sin, eps);
}

// Backward: autograd through the C++ op (its reference on the CPU; on CUDA
// its backward kernels after its forward again).
std::vector<at::Tensor> qk_norm_rope_backward(const std::vector<at::Tensor>& grads,
                                              const c10::List<std::optional<at::Tensor>>& inputs, int64_t heads,
                                              double eps) {
  return backward_through(
      [&](const Tensors& in) { return Tensors{ops::qk_norm_rope(in[0], heads, in[1], in[2], in[3], in[4], eps)}; },
      grads, inputs);
}

// (out [B, T, D], lse [B, H, T] fp32). Our whole-head forward where it
// applies (its lse is what its backward reads); elsewhere ops::qkv_attention
// (cuDNN's fused attention, ATen's SDPA on the CPU) and zeros for the lse,
// which nothing reads there.
std::tuple<at::Tensor, at::Tensor> attention(const at::Tensor& qkv, int64_t heads) {
  const at::NoGradGuard no_grad;
  const int64_t batch = qkv.size(0), tokens = qkv.size(1);
  if (ops::whole_head_attention_applies(qkv, heads)) {
    auto [out, lse] = ops::try_attention_head_fwd(qkv, heads);  // out [B, H, T, d] in [B, T, H, d] memory
    return {out.transpose(1, 2).reshape({batch, tokens, -1}), lse};
  }
  const at::Tensor out = ops::qkv_attention(qkv, heads);
  return {out.contiguous(), at::zeros({batch, heads, tokens}, qkv.options().dtype(at::kFloat))};
}

at::Tensor attention_backward(const at::Tensor& grad, const at::Tensor& qkv, const at::Tensor& out,
                              const at::Tensor& lse, int64_t heads) {
  if (ops::whole_head_attention_applies(qkv, heads)) {
    const int64_t batch = qkv.size(0), tokens = qkv.size(1), dim = out.size(2);
    const at::Tensor out_heads = out.view({batch, tokens, heads, dim / heads}).transpose(1, 2);
    return ops::try_attention_head_bwd(qkv, out_heads, lse, grad.contiguous(), heads, /*forward_was_ours=*/true);
  }
  c10::List<std::optional<at::Tensor>> inputs;
  inputs.push_back(qkv);
  return backward_through([&](const Tensors& in) { return Tensors{ops::qkv_attention(in[0], heads)}; }, {grad},
                          inputs)[0];
}

}  // namespace
}  // namespace perftrain::python

TORCH_LIBRARY_FRAGMENT(perftrain, m) {
  m.def("qk_norm_rope(Tensor qkv, Tensor? q_weight, Tensor? k_weight, Tensor cos, Tensor sin, int heads,"
        " float eps) -> Tensor");
  m.def("qk_norm_rope_backward(Tensor[] grads, Tensor?[] inputs, int heads, float eps) -> Tensor[]");
  m.def("attention(Tensor qkv, int heads) -> (Tensor, Tensor)");
  m.def("attention_backward(Tensor grad, Tensor qkv, Tensor out, Tensor lse, int heads) -> Tensor");
}

TORCH_LIBRARY_IMPL(perftrain, CPU, m) {
  m.impl("qk_norm_rope", &perftrain::python::qk_norm_rope);
  m.impl("qk_norm_rope_backward", &perftrain::python::qk_norm_rope_backward);
  m.impl("attention", &perftrain::python::attention);
  m.impl("attention_backward", &perftrain::python::attention_backward);
}

TORCH_LIBRARY_IMPL(perftrain, CUDA, m) {
  m.impl("qk_norm_rope", &perftrain::python::qk_norm_rope);
  m.impl("qk_norm_rope_backward", &perftrain::python::qk_norm_rope_backward);
  m.impl("attention", &perftrain::python::attention);
  m.impl("attention_backward", &perftrain::python::attention_backward);
}
