// The gated residual of one DiT sub-block fused with the adaLN LayerNorm that
// opens the next, as one autograd function with two outputs:
//   x1 = x + gate[:, None, :] * (y + bias)                 (x's dtype: the residual stream)
//   h  = LN(x1) * (1 + scale[:, None, :]) + shift[:, None, :]   (out_dtype: the next matmul's operand)
// exactly gated_residual followed by adaln_layernorm, in one pass over the rows
// forward and one backward (kernels/residual_adaln.h): x1 is not read back to
// normalise it, and the gradient reaching x1 from later layers is added to the
// LayerNorm's own inside the backward kernel instead of by autograd. The bias
// (optional) is that of the linear layer that made y, folded in here so that
// its gradient comes from the backward's column sums, not a reduction of its own.
//
// For the LayerNorm's backward the CUDA op keeps the normalised rows
// xhat = (x1 - mean) * rstd in h's dtype when that is narrower than x's (the
// bf16 DiT path: fp32 residual stream), else x1 and the means. A bf16 xhat is
// half an fp32 x1's memory for the same traffic (the forward writes it, the
// backward reads it instead of x1); the LN gradient then uses xhat rounded to
// bf16 (relative 2^-9), like the bf16 operands every other gradient here is
// made from.
#pragma once

#include <ATen/core/Tensor.h>

#include <utility>

namespace perftrain::ops {

// x, y [B, T, D] float32/bfloat16/float16 (any mix); gate, shift, scale [B, D]
// float32/bfloat16/float16 (strided views such as chunks of one [B, 6D] tensor
// are fine; the last dimension must be contiguous, else they are copied); bias
// [D] float32/bfloat16/float16/float64 or undefined (= zero; the CUDA kernels
// read it as float32). Returns {x1 [B, T, D] in x's dtype, h [B, T, D] in
// out_dtype}; either may be left unused. Gradients: x's in x's dtype, y's in
// y's dtype, gate's, shift's, scale's and bias's in their own dtypes. CUDA:
// fused kernels (D up to 8192); fastest when gate, shift and scale share a
// dtype and y has out_dtype (otherwise they go through float32 copies). CPU:
// residual_adaln_reference. Bad shapes, dtypes or devices throw UsageError.
std::pair<at::Tensor, at::Tensor> residual_adaln(const at::Tensor& x, const at::Tensor& gate, const at::Tensor& y,
                                                 const at::Tensor& shift, const at::Tensor& scale,
                                                 at::ScalarType out_dtype, double eps = 1e-6,
                                                 const at::Tensor& bias = at::Tensor());

// The plain-ATen reference: gated_residual_reference (with the bias), then
// adaln_layernorm_reference on its result (fp32 math, fp64 when any input is
// fp64); autograd through ATen gives its backward.
std::pair<at::Tensor, at::Tensor> residual_adaln_reference(const at::Tensor& x, const at::Tensor& gate,
                                                           const at::Tensor& y, const at::Tensor& shift,
                                                           const at::Tensor& scale, at::ScalarType out_dtype,
                                                           double eps = 1e-6, const at::Tensor& bias = at::Tensor());

}  // namespace perftrain::ops
