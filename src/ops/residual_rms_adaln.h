// The single-stream DiT's sandwich post-norm, tanh-gated residual and the
// pre-norm that opens the next branch, as one autograd function with two
// outputs:
//   yn = rms(y) * post_weight
//   x1 = x + tanh(gate)[:, None, :] * yn                     (x's dtype: the residual stream)
//   h  = rms(x1) * pre_weight * (1 + scale[:, None, :])       (out_dtype: the next product's operand)
// with rms(v) = v * rsqrt(mean_D(v^2) + eps) in fp32: exactly rms_adaln of y
// (weight post_weight, no scale), the gated residual, then rms_adaln of x1,
// in one pass over the rows forward and one backward
// (kernels/residual_rms_adaln.h). x1 is normalised as stored (rounded to x's
// dtype); the gradient reaching x1 from later layers is added to the norm's
// own inside the backward kernel instead of by autograd. The weight gradients
// (per-sample fp32 column sums, summed over the batch) go through
// ops::run_weight_grads.
//
// What the CUDA op keeps for the backward: y as given (in h's kernel type)
// and its per-row rstd; for x1's norm the per-row rstd and either x1 or, when
// out_dtype is 16-bit and x is wider (fp32 residual stream, bf16 operands),
// the normalised rows x1 * rstd in out_dtype: half an fp32 x1's memory, and x1
// itself is then not held by this op (the next residual reads it, but keeps
// nothing of it). The gradient then uses that xhat rounded to bf16 (relative
// 2^-9), like the bf16 operands every other gradient here is made from.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <utility>

#include "ops/fp8_cast.h"

namespace perftrain::ops {

// x, y [B, T, D] float32/bfloat16/float16 (any mix); gate [B, D] and scale
// [B, D] float32/bfloat16/float16 (strided views such as chunks of one [B, kD]
// tensor are fine; the last dimension must be contiguous, else they are
// copied); scale may be undefined (= 0); post_weight, pre_weight [D]
// float32/bfloat16/float16/float64 or undefined (= ones; read through
// ops::compute_weight as float32). Returns {x1 [B, T, D] in x's dtype,
// h [B, T, D] in out_dtype}; either may be left unused. Gradients: x, gate,
// y, post_weight, pre_weight, scale, each in its own dtype. CUDA: fused
// kernels (D up to 8192); fastest when gate and scale share a dtype and y has
// out_dtype (otherwise they go through float32 copies). CPU:
// residual_rms_adaln_reference. Bad shapes, dtypes or devices throw UsageError.
std::pair<at::Tensor, at::Tensor> residual_rms_adaln(const at::Tensor& x, const at::Tensor& gate,
                                                     const at::Tensor& y, const at::Tensor& post_weight,
                                                     const at::Tensor& pre_weight, const at::Tensor& scale,
                                                     at::ScalarType out_dtype, double eps = 1e-6);

// residual_rms_adaln handing h to an fp8 linear (ops/fp8_cast.h,
// Fp8Operand): x1, and h's E4M3 codes for `target` with their amax. CUDA:
// written by the same pass in place of h where y is in out_dtype
// (row_norm_op.h: fused_fp8_output; else h, then fp8_cast), the operand's x
// the stand-in, whose gradient is h's. CPU: the reference's h, then
// fp8_cast. The bytes and amax of fp8_cast(residual_rms_adaln(...).second).
std::pair<at::Tensor, Fp8Operand> residual_rms_adaln_fp8(const at::Tensor& x, const at::Tensor& gate,
                                                         const at::Tensor& y, const at::Tensor& post_weight,
                                                         const at::Tensor& pre_weight, const at::Tensor& scale,
                                                         at::ScalarType out_dtype, const Fp8Target& target,
                                                         double eps = 1e-6);

// The plain-ATen reference (fp32 math, fp64 when any input is fp64): yn and
// x1 as above, x1 rounded to x's dtype, then rms_adaln_reference(x1,
// pre_weight, scale, out_dtype, eps); autograd through ATen gives its backward.
std::pair<at::Tensor, at::Tensor> residual_rms_adaln_reference(const at::Tensor& x, const at::Tensor& gate,
                                                               const at::Tensor& y, const at::Tensor& post_weight,
                                                               const at::Tensor& pre_weight, const at::Tensor& scale,
                                                               at::ScalarType out_dtype, double eps = 1e-6);

namespace detail {
// residual_rms_adaln's checks of its arguments (UsageError naming the input).
void check_residual_rms_adaln_args(const at::Tensor& x, const at::Tensor& gate, const at::Tensor& y,
                                   const at::Tensor& post_weight, const at::Tensor& pre_weight,
                                   const at::Tensor& scale, at::ScalarType out_dtype);
// The CUDA pieces of the autograd function on their own, what it and the
// Python op (python/csrc/ops_residual.cpp) run, on checked inputs. The
// forward's outputs x1 and h (in out_dtype), and what the backward reads: y
// in the activations' kernel type act (out_dtype, or float32 where y is not
// in out_dtype), gate and scale (or undefined) in their shared kernel type,
// the weights as dense float32 (or undefined), y's and x1's per-row float32
// rstd [B*T], and xhat (in act) where it is kept: then x1 is not read.
struct ResidualRmsAdaLNForward {
  at::Tensor x1, h, codes;  // codes: with fp8, h's (then h may be the stand-in)
  at::Tensor y, gate, scale, post_weight, pre_weight, y_rstd, rstd, xhat;
  at::ScalarType act = at::kFloat;
};
ResidualRmsAdaLNForward residual_rms_adaln_forward_cuda(const at::Tensor& x, const at::Tensor& gate,
                                                        const at::Tensor& y, const at::Tensor& post_weight,
                                                        const at::Tensor& pre_weight, const at::Tensor& scale,
                                                        at::ScalarType out_dtype, double eps,
                                                        const Fp8Target* fp8 = nullptr);
// The inputs' dtypes (each gradient's), those of the optional ones where given.
struct ResidualRmsAdaLNDtypes {
  at::ScalarType x, gate, y;
  std::optional<at::ScalarType> post_weight, pre_weight, scale;
};
// Which inputs' gradients are wanted.
struct ResidualRmsAdaLNWants {
  bool x, gate, y, post_weight, pre_weight, scale;
};
struct ResidualRmsAdaLNGrads {
  at::Tensor x, gate, y, post_weight, pre_weight, scale;
};
// The backward from the incoming gradients of x1 and h (either may be
// undefined: that output was not used) and what the forward kept; gradients
// not wanted (and pre_weight's and scale's with h unused) are undefined.
ResidualRmsAdaLNGrads residual_rms_adaln_backward_cuda(const at::Tensor& dx1, const at::Tensor& dh,
                                                       const ResidualRmsAdaLNForward& saved,
                                                       const ResidualRmsAdaLNDtypes& dtypes,
                                                       const ResidualRmsAdaLNWants& wants);
}  // namespace detail

}  // namespace perftrain::ops
