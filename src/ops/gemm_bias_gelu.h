// The MLP's two GELU products through our own Hopper kernels
// (kernels/gemm_bias_gelu_sm90.h), from tensors. gelu_mlp runs fc1 through
// try_gemm_bias_gelu_sm90 wherever it applies (it beats cuBLASLt's
// GELU_AUX_BIAS epilogue, which stays as the fallback). The backward's DGELU
// form is slower than cuBLASLt's DGELU epilogue, so the training step does
// not call try_gemm_dgelu_sm90; its GPU test and benchmark do.
#pragma once

#include <ATen/core/Tensor.h>

namespace perftrain::ops {

// pre = x w^T + b and act = gelu_tanh(pre) into the given bf16 [m, n]
// tensors, on the current stream. x [m, k] and w [n, k] bf16 contiguous on
// an sm_90 GPU, b [n] float32 or bfloat16, shapes the kernel takes (m % 128,
// n % 256, k % 64). Returns false, launching nothing, otherwise.
bool try_gemm_bias_gelu_sm90(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b, const at::Tensor& pre,
                             const at::Tensor& act);

// dpre = (dy w2) * gelu_tanh'(pre) into the given bf16 [m, n] tensor: dy
// [m, k], w2 [k, n] (as fc2 keeps it; its transpose is made here, a new
// n x k tensor each call: a training step would keep one per weight instead),
// pre [m, n], all bf16 contiguous, the kernel's shapes, an sm_90 GPU.
// Returns false, launching nothing, otherwise.
bool try_gemm_dgelu_sm90(const at::Tensor& dy, const at::Tensor& w2, const at::Tensor& pre, const at::Tensor& dpre);

}  // namespace perftrain::ops
