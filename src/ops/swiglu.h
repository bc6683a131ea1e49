// SwiGLU's gating as one autograd function: from the packed output of ONE
// product against the concatenated weights [gate.weight; up.weight] ([2F, D]),
//   gate_up [..., 2F] (gate = the first F columns, up = the last F)
//   -> silu(gate) * up [..., F]
// in one pass over gate_up (fp32 math, one rounding to the output), where the
// unfused form reads the two halves as strided views and writes silu(gate) in
// between. Its backward makes d(gate_up) [..., 2F] in one pass from the
// incoming gradient and the saved gate_up (kernels/swiglu.h):
//   d(gate) = dout * up * silu'(gate),  d(up) = dout * silu(gate).
#pragma once

#include <ATen/core/Tensor.h>

namespace perftrain::ops {

// gate_up [..., 2F] (F >= 1, any F, any number of rows; a strided gate_up is
// copied dense first) float32/bfloat16/float16 -> silu(gate) * up [..., F] in
// gate_up's dtype (fp32 math). Grad: gate_up [..., 2F] in its dtype. The
// model makes gate_up with ONE product against the concatenated weights
// [gate.weight; up.weight] ([2F, D]). CUDA: the fused kernels; CPU:
// swiglu_reference. An odd last dimension, a 0-d tensor or another dtype
// throws UsageError.
at::Tensor swiglu(const at::Tensor& gate_up);

// linear(swiglu(gate_up), down_weight) without keeping swiglu's output
// [..., F] from forward to backward (the single-stream FFN under
// speed.gelu_recompute): forward keeps gate_up and the product's weight; the
// backward makes the activation again with the same kernel for down_weight's
// gradient, so that every value equals the composition's (bit for bit on
// CUDA). One [..., F] tensor less held per FFN for one pass over gate_up in
// backward. down_weight [N, F] as ops::linear takes it (no bias). CPU: the
// composition of the references. Bad shapes or dtypes throw UsageError.
at::Tensor swiglu_linear(const at::Tensor& gate_up, const at::Tensor& down_weight);

// silu(x gate_w^T) * (x up_w^T) [..., F]: the single-stream FFN's gate-up
// product and SwiGLU's forward as one op. gate_w and up_w [F, K] as
// ops::stacked_linear takes them (no biases). CUDA, bf16, sm_90 and the
// kernel's shapes (rows % 128, F % 64, K % 64): ONE launch of
// kernels::gemm_swiglu_sm90 writes gate_up [rows, 2F] and the output, h from
// the fp32 products (within a bf16 step of swiglu(stacked_linear(...)),
// which rounds gate_up first); elsewhere on CUDA the stacked product then
// swiglu's kernel (those bits). Forward keeps what the two ops keep (x for the
// weights' gradients, the stacked weight for x's, gate_up); backward is theirs:
// d(gate_up) by swiglu's kernel, then the stacked product's backward. CPU: the
// references' composition. Bad shapes or dtypes throw UsageError.
at::Tensor swiglu_product(const at::Tensor& x, const at::Tensor& gate_w, const at::Tensor& up_w);

// linear(swiglu_product(x, gate_w, up_w), down_weight) keeping only what
// swiglu_linear keeps (gate_up and down's weight; with x and the stacked
// weight for the product's backward): the activation lives in forward just
// long enough for down's product (the single-stream FFN under
// speed.gelu_recompute). The same kernel choice as swiglu_product; backward
// swiglu_linear's then the stacked product's (down's weight gradient from
// the activation made again from the bf16 gate_up: within a bf16 step of
// the forward's where the fused kernel ran, the same bits elsewhere).
// CPU: swiglu_linear of stacked_linear. Bad shapes or dtypes throw
// UsageError.
at::Tensor swiglu_product_linear(const at::Tensor& x, const at::Tensor& gate_w, const at::Tensor& up_w,
                                 const at::Tensor& down_weight);

// The plain-ATen reference: at::silu(gate) * up on the two narrow() halves,
// computed in fp32 (fp64 when gate_up is fp64, which it also takes) and cast
// to gate_up's dtype; autograd through it is the reference backward.
at::Tensor swiglu_reference(const at::Tensor& gate_up);

namespace detail {
// The CUDA backward on its own (what the autograd functions and the Python
// op's backward run): d(gate_up) [..., 2F], dense in gate_up's dtype, from the
// incoming gradient [..., F] and the forward's gate_up.
at::Tensor swiglu_backward_cuda(const at::Tensor& grad, const at::Tensor& gate_up);
}  // namespace detail

}  // namespace perftrain::ops
