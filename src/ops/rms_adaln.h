// RMSNorm (statistics in fp32, a learned weight per column) fused with the
// adaLN scale of the single-stream DiT blocks (no shift), as one autograd
// function:
//   h = rms(x) * weight * (1 + scale[:, None, :]),  rms(v) = v * rsqrt(mean_D(v^2) + eps)
// written straight in the dtype of the product that consumes it. The backward
// sums the scale's gradient over tokens and the weight's over all rows
// deterministically (kernels/rms_adaln.h); the weight gradient goes through
// ops::run_weight_grads.
//
// What the CUDA op keeps for the backward: the per-row rstd (fp32) and either
// x itself or, when out_dtype is 16-bit and x is wider (an fp32 residual stream
// normalised into a bf16 operand), the normalised rows xhat = x * rstd in
// out_dtype: half of an fp32 x's memory, and x (which no other backward needs)
// may then be freed. The gradient then uses xhat rounded to bf16 (relative
// 2^-9), like the bf16 operands every other gradient here is made from.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>

#include "ops/fp8_cast.h"

namespace perftrain::ops {

// x [B, T, D] float32/bfloat16/float16; weight [D] float32/bfloat16/float16/
// float64 or undefined (= ones; read through ops::compute_weight as float32);
// scale [B, D] float32/bfloat16/float16 (strided views such as a chunk of one
// [B, kD] tensor are fine; the last dimension must be contiguous, else it is
// copied) or undefined (= 0). Returns [B, T, D] in out_dtype
// (float32/bfloat16/float16). Gradients: x's, weight's and scale's in their
// own dtypes. CUDA: fused kernels (D up to 8192). CPU: rms_adaln_reference.
// Bad shapes, dtypes or devices throw UsageError.
at::Tensor rms_adaln(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& scale,
                     at::ScalarType out_dtype, double eps = 1e-6);

// rms_adaln handing h to an fp8 linear (ops/fp8_cast.h, Fp8Operand): its
// E4M3 codes for `target` with their amax. CUDA: written by the norm's own
// pass in place of h (row_norm_op.h: fused_fp8_output), the operand's x the
// stand-in, whose gradient is h's. CPU: the reference's h, then fp8_cast.
// The bytes and amax of fp8_cast(rms_adaln(...)) either way.
Fp8Operand rms_adaln_fp8(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& scale,
                         at::ScalarType out_dtype, const Fp8Target& target, double eps = 1e-6);

// The plain-ATen reference: computed in fp32 (fp64 when any input is fp64),
// the result cast to out_dtype; autograd through ATen gives its backward.
at::Tensor rms_adaln_reference(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& scale,
                               at::ScalarType out_dtype, double eps = 1e-6);

namespace detail {
// rms_adaln's checks of its arguments (UsageError naming the input).
void check_rms_adaln_args(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& scale,
                          at::ScalarType out_dtype);
// The CUDA pieces of the autograd function on their own, what it and the
// Python op (python/csrc/ops_norm.cpp) run, on checked inputs. The forward's
// h, and what the backward reads: x made dense, or (undefined x) xhat in
// out_dtype where it is kept instead (see the top of this file); the weight as
// dense float32 and scale as the kernels read it (either undefined where
// absent); the per-row float32 rstd [B*T].
struct RmsAdaLNForward {
  at::Tensor h, x, xhat, weight, scale, rstd;
  at::Tensor codes;  // with fp8: h's (h then the stand-in)
};
RmsAdaLNForward rms_adaln_forward_cuda(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& scale,
                                       at::ScalarType out_dtype, double eps, const Fp8Target* fp8 = nullptr);
// The backward from the incoming gradient of h and what the forward kept: dx
// in x_dtype, and the weight's and scale's gradients in the given dtypes
// (nullopt: not wanted, left undefined).
struct RmsAdaLNGrads {
  at::Tensor x, weight, scale;
};
RmsAdaLNGrads rms_adaln_backward_cuda(const at::Tensor& grad, const RmsAdaLNForward& saved, at::ScalarType out_dtype,
                                      at::ScalarType x_dtype, std::optional<at::ScalarType> weight_dtype,
                                      std::optional<at::ScalarType> scale_dtype);
}  // namespace detail

}  // namespace perftrain::ops
