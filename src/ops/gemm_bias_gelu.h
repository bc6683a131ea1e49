// fc1 with its bias and GELU through our own Hopper product
// (kernels/gemm_bias_gelu_sm90.h) instead of cuBLASLt's GELU_AUX_BIAS
// epilogue, where it applies. gelu_mlp takes it with PERFTRAIN_FC1_GEMM=sm90
// (off by default until it is measured faster on the GPU).
#pragma once

#include <ATen/core/Tensor.h>

namespace perftrain::ops {

// Whether PERFTRAIN_FC1_GEMM=sm90 was set (read once).
bool own_fc1_product();

// pre = x w^T + b and act = gelu_tanh(pre) into the given bf16 [m, n]
// tensors, on the current stream. x [m, k] and w [n, k] bf16 contiguous on
// an sm_90 GPU, b [n] float32 or bfloat16, shapes the kernel takes (m % 128,
// n % 256, k % 64). Returns false, launching nothing, otherwise.
bool try_gemm_bias_gelu_sm90(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b, const at::Tensor& pre,
                             const at::Tensor& act);

}  // namespace perftrain::ops
