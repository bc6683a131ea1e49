// fc1 of the MLP, bias and GELU, through our own Hopper kernel
// (kernels/gemm_bias_gelu_sm90.h), from tensors. gelu_mlp runs it wherever
// it applies (it beats cuBLASLt's GELU_AUX_BIAS epilogue, which stays as the
// fallback). The same kernel with W read MN-major runs the backward's
// product through GELU with fc1's bias gradient from its column partials
// (one of the forms ops::gelu_mlp times against cuBLASLt's).
// The same kernel with SwiGLU in its epilogue runs the single-stream FFN's
// gate-up product where it applies (ops::swiglu_product).
#pragma once

#include <ATen/core/Tensor.h>

namespace perftrain::ops {

// pre = x w^T + b and act = gelu_tanh(pre) into the given bf16 [m, n]
// tensors, on the current stream. x [m, k] and w [n, k] bf16 contiguous on
// an sm_90 GPU, b [n] float32 or bfloat16, shapes the kernel takes (m % 128,
// n % 256, k % 64). Returns false, launching nothing, otherwise.
bool try_gemm_bias_gelu_sm90(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b, const at::Tensor& pre,
                             const at::Tensor& act);

// dpre = (dy w2) * gelu_tanh'(pre) into the given bf16 [m, n] tensor and,
// when db1 is defined, db1 = its column sums (fp32 [n], of dpre as stored),
// on the current stream. dy [m, k] and w2 [k, n] (fc2's weight) and pre
// [m, n] bf16 contiguous on an sm_90 GPU, shapes the kernel takes (m % 128,
// n % 256, k % 64). Returns false, launching nothing, otherwise.
bool try_gemm_dgelu_sm90(const at::Tensor& dy, const at::Tensor& w2, const at::Tensor& pre, const at::Tensor& dpre,
                         const at::Tensor& db1);

// gate_up = x w^T and h = silu(gate_up[:, :f]) * gate_up[:, f:] into the
// given bf16 tensors ([m, 2f], [m, f]), on the current stream. x [m, k] and
// w [2f, k] (gate rows then up rows) bf16 contiguous on an sm_90 GPU, shapes
// the kernel takes (m % 128, f % 64, k % 64). Returns false, launching
// nothing, otherwise.
bool try_gemm_swiglu_sm90(const at::Tensor& x, const at::Tensor& w, const at::Tensor& gate_up, const at::Tensor& h);

}  // namespace perftrain::ops
