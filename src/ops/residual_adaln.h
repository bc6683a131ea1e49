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

#include <optional>
#include <utility>

#include "ops/fp8_cast.h"

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

// residual_adaln handing h to an fp8 linear (ops/fp8_cast.h, Fp8Operand): x1,
// and h's E4M3 codes for `target` with their amax. CUDA: written by the same
// pass in place of h where y is in out_dtype (row_norm_op.h:
// fused_fp8_output; else h, then fp8_cast), the operand's x the stand-in,
// whose gradient is h's. CPU: the reference's h, then fp8_cast. The bytes and
// amax of fp8_cast(residual_adaln(...).second) either way.
std::pair<at::Tensor, Fp8Operand> residual_adaln_fp8(const at::Tensor& x, const at::Tensor& gate,
                                                     const at::Tensor& y, const at::Tensor& shift,
                                                     const at::Tensor& scale, at::ScalarType out_dtype,
                                                     const Fp8Target& target, double eps = 1e-6,
                                                     const at::Tensor& bias = at::Tensor());

// The plain-ATen reference: gated_residual_reference (with the bias), then
// adaln_layernorm_reference on its result (fp32 math, fp64 when any input is
// fp64); autograd through ATen gives its backward.
std::pair<at::Tensor, at::Tensor> residual_adaln_reference(const at::Tensor& x, const at::Tensor& gate,
                                                           const at::Tensor& y, const at::Tensor& shift,
                                                           const at::Tensor& scale, at::ScalarType out_dtype,
                                                           double eps = 1e-6, const at::Tensor& bias = at::Tensor());

namespace detail {
// residual_adaln's checks of its arguments (UsageError naming the input).
void check_residual_adaln_args(const at::Tensor& x, const at::Tensor& gate, const at::Tensor& y,
                               const at::Tensor& shift, const at::Tensor& scale, at::ScalarType out_dtype,
                               const at::Tensor& bias);
// The CUDA pieces of the autograd function on their own, what it and the
// Python op (python/csrc/ops_residual.cpp) run, on checked inputs. The
// forward's outputs x1 and h (in out_dtype), and what the backward reads: y
// in the activations' kernel type act (out_dtype, or float32 where y is not
// in out_dtype), gate and scale in their shared kernel type, the bias as
// dense float32 (or undefined), the per-row float32 mean and rstd [B*T], and
// xhat (in act) where it is kept: then the backward reads neither x1 nor the
// mean (see the top of this file).
struct ResidualAdaLNForward {
  at::Tensor x1, h, codes;  // codes: with fp8, h's (then h may be the stand-in)
  at::Tensor y, gate, scale, bias, mean, rstd, xhat;
  at::ScalarType act = at::kFloat;
};
ResidualAdaLNForward residual_adaln_forward_cuda(const at::Tensor& x, const at::Tensor& gate, const at::Tensor& y,
                                                 const at::Tensor& shift, const at::Tensor& scale,
                                                 at::ScalarType out_dtype, double eps, const at::Tensor& bias,
                                                 const Fp8Target* fp8 = nullptr);
// The inputs' dtypes (each gradient's), the bias's where there is one.
struct ResidualAdaLNDtypes {
  at::ScalarType x, gate, y, shift, scale;
  std::optional<at::ScalarType> bias;
};
// Which inputs' gradients are wanted.
struct ResidualAdaLNWants {
  bool x, gate, y, shift, scale, bias;
};
struct ResidualAdaLNGrads {
  at::Tensor x, gate, y, shift, scale, bias;
};
// The backward from the incoming gradients of x1 and h (either may be
// undefined: that output was not used) and what the forward kept. Gradients
// not wanted are undefined; with h unused, shift's and scale's are too and
// x's is dx1 itself.
ResidualAdaLNGrads residual_adaln_backward_cuda(const at::Tensor& dx1, const at::Tensor& dh,
                                                const ResidualAdaLNForward& saved, const ResidualAdaLNDtypes& dtypes,
                                                const ResidualAdaLNWants& wants);
}  // namespace detail

}  // namespace perftrain::ops
