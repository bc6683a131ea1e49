// LayerNorm (no affine, statistics in fp32) fused with adaLN modulation, as
// one autograd function: the start of each half of a DiT block,
//   h = LN(x) * (1 + scale[:, None, :]) + shift[:, None, :]
// written straight in the dtype of the matmul that consumes it. The backward
// reads x, dy and the saved per-row mean/rstd once and writes dx, with
// dshift/dscale summed over tokens deterministically (kernels/adaln_layernorm.h).
#pragma once

#include <ATen/core/Tensor.h>

#include "ops/fp8_cast.h"

namespace perftrain::ops {

// x [B, T, D] float32/bfloat16/float16; shift, scale [B, D] float32/bfloat16/
// float16 (strided views such as chunks of one [B, 6D] tensor are fine; the
// last dimension must be contiguous, else they are copied). Returns
// [B, T, D] in out_dtype (float32/bfloat16/float16). Gradients: x's in x's
// dtype, shift's and scale's in their own dtypes. CUDA: fused kernels (D up
// to 8192). CPU: adaln_layernorm_reference. Bad shapes, dtypes or devices
// throw UsageError.
at::Tensor adaln_layernorm(const at::Tensor& x, const at::Tensor& shift, const at::Tensor& scale,
                           at::ScalarType out_dtype, double eps = 1e-6);

// adaln_layernorm handing h to an fp8 linear (ops/fp8_cast.h, Fp8Operand):
// its E4M3 codes for `target` with their amax. CUDA: written by the norm's own
// pass in place of h (row_norm_op.h: fused_fp8_output), the operand's x the
// stand-in, whose gradient is h's. CPU: the reference's h, then
// fp8_cast. The bytes and amax of fp8_cast(adaln_layernorm(...)) either way.
Fp8Operand adaln_layernorm_fp8(const at::Tensor& x, const at::Tensor& shift, const at::Tensor& scale,
                               at::ScalarType out_dtype, const Fp8Target& target, double eps = 1e-6);

// The plain-ATen reference: computed in fp32 (fp64 when any input is fp64),
// the result cast to out_dtype; autograd through ATen gives its backward.
at::Tensor adaln_layernorm_reference(const at::Tensor& x, const at::Tensor& shift, const at::Tensor& scale,
                                     at::ScalarType out_dtype, double eps = 1e-6);

namespace detail {
// adaln_layernorm's checks of its arguments (UsageError naming the input).
void check_adaln_layernorm_args(const at::Tensor& x, const at::Tensor& shift, const at::Tensor& scale,
                                at::ScalarType out_dtype);
// The CUDA pieces of the autograd function on their own, what it and the
// Python op (python/csrc/ops_norm.cpp) run. Forward: h, and what the backward
// reads (inputs checked as above): x made dense, scale as the kernels read it (per_sample_rows of shift
// and scale: one kernel type), the per-row fp32 mean and rstd [B*T]. With fp8
// (fused_fp8_output): h's codes [B*T, D] for it, and h the stand-in.
struct AdaLNLayerNormForward {
  at::Tensor h, x, scale, mean, rstd, codes;
};
AdaLNLayerNormForward adaln_layernorm_forward_cuda(const at::Tensor& x, const at::Tensor& shift,
                                                   const at::Tensor& scale, at::ScalarType out_dtype, double eps,
                                                   const Fp8Target* fp8 = nullptr);
// Backward from the incoming gradient dh and the forward's x, scale, mean and
// rstd (as AdaLNLayerNormForward holds them): dx in x's dtype, dshift and
// dscale in the given dtypes (the inputs').
struct AdaLNLayerNormGrads {
  at::Tensor x, shift, scale;
};
AdaLNLayerNormGrads adaln_layernorm_backward_cuda(const at::Tensor& dh, const at::Tensor& x, const at::Tensor& scale,
                                                  const at::Tensor& mean, const at::Tensor& rstd,
                                                  at::ScalarType out_dtype, at::ScalarType shift_dtype,
                                                  at::ScalarType scale_dtype);
}  // namespace detail

}  // namespace perftrain::ops
