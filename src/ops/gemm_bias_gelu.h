// The MLP's two GELU products through our own Hopper kernel
// (kernels/gemm_bias_gelu_sm90.h) instead of cuBLASLt's GELU_AUX_BIAS and
// DGELU epilogues, where it applies. gelu_mlp takes them with
// PERFTRAIN_FC1_GEMM=sm90 and PERFTRAIN_DGELU_GEMM=sm90 (off by default
// until measured correct and faster on the GPU).
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

// Whether PERFTRAIN_DGELU_GEMM=sm90 was set (read once).
bool own_dgelu_product();

// dpre = (dy w2) * gelu_tanh'(pre) into the given bf16 [m, n] tensor: dy
// [m, k], w2 [k, n] (as fc2 keeps it; its transpose is made here, n x k
// elements), pre [m, n], all bf16 contiguous, the kernel's shapes, an sm_90
// GPU. Returns false, launching nothing, otherwise.
bool try_gemm_dgelu_sm90(const at::Tensor& dy, const at::Tensor& w2, const at::Tensor& pre, const at::Tensor& dpre);

}  // namespace perftrain::ops
