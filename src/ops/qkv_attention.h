// Multi-head self-attention on a packed qkv projection as one autograd
// function around cuDNN's fused attention (forward and backward called
// directly). Why not at::scaled_dot_product_attention on three views: its
// backward returns dq, dk, dv as three tensors that autograd stacks and then
// permutes back into the packed layout, two copies that cost more than the
// attention itself (3.5 + 2.9 ms of a 41 ms DiT-S/2 b256 step, measured).
// Here cuDNN reads q, k, v straight from the packed tensor and writes its
// output and gradients in the token-major layout the matrix products read.
//
// projected_attention goes one step further and owns the qkv projection too:
// its backward feeds cuDNN's dq, dk, dv straight to the projection's products
// (dW row block i = dQKV_i^T h, dh = sum_i dQKV_i W_i accumulated in place),
// so the gradients are never copied into the packed layout (those copies were
// 16.9 ms of a 398 ms DiT-XL/2 b256 step).
#pragma once

#include <ATen/core/Tensor.h>

namespace perftrain::ops {

// qkv [B, T, 3*D] laid out as (3, heads, D/heads) in the last dim -> [B, T, D].
// CUDA bf16/fp16: cuDNN attention; otherwise (CPU, fp32, or cuDNN refusing
// the shape once) self_attention(), ATen's SDPA under autograd.
at::Tensor qkv_attention(const at::Tensor& qkv, int64_t heads);

// qkv_attention(linear(h, qkv_weight, qkv_bias), heads) as one autograd
// function: h [B, T, D] in the compute dtype, qkv_weight [3D, D] and
// qkv_bias [3D] (may be undefined) as for ops::linear. Gradients as linear's.
// Falls back to exactly that composition where qkv_attention would not use
// cuDNN. On the cuDNN path the key block of qkv_bias's gradient is exactly
// zero (softmax is shift-invariant per query; the composition gives rounding
// noise there). Bad shapes or dtypes throw UsageError.
at::Tensor projected_attention(const at::Tensor& h, const at::Tensor& qkv_weight, const at::Tensor& qkv_bias,
                               int64_t heads);

// The fp32 reference: linear_reference, then softmax attention in ATen math.
at::Tensor projected_attention_reference(const at::Tensor& h, const at::Tensor& qkv_weight,
                                         const at::Tensor& qkv_bias, int64_t heads);

}  // namespace perftrain::ops
