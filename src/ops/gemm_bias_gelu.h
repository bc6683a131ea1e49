// The MLP's two GELU products through our own Hopper kernel
// (kernels/gemm_bias_gelu_sm90.h), from tensors. gelu_mlp takes fc1's
// (faster than cuBLASLt's GELU_AUX_BIAS on the H200, docs/PERFORMANCE.md);
// the backward's DGELU form is slower than cuBLASLt's, so only the tests and
// bench_gemm_bias_gelu call it.
#pragma once

#include <ATen/core/Tensor.h>

namespace perftrain::ops {

// Whether fc1 goes through our kernel: yes unless PERFTRAIN_FC1_GEMM=cublaslt
// (read once), to compare.
bool own_fc1_product();

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
