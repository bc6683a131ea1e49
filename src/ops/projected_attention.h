// Multi-head self-attention with its qkv projection, h [B, T, D] -> [B, T, D],
// as one autograd function: the projection writes the packed qkv [B, T, 3D]
// that the attention reads in place (ops/qkv_attention.h says why packed).
// The attention itself is our whole-head kernels where they apply
// (ops/attention_head_fwd and ops/attention_head_bwd: bf16 on sm_90, 256
// tokens, head dim 64 or 72; the [speed] key attention = "whole_head"), with
// attention = "tiled" our tiled kernels at any length from 64 tokens
// (ops/attention_tiled; at 256 tokens the whole-head backward), cuDNN's
// fused attention otherwise (ops/cudnn_attention.h), and qkv_attention's own path
// where cuDNN does not run (CPU, fp32, a shape it refuses). The backward
// feeds the packed gradient, or cuDNN's dq, dk, dv in place, straight to the
// projection's products (dW row block i = dQKV_i^T h, dh = sum_i dQKV_i W_i
// accumulated in place), so the gradients are never copied into another
// layout.
#pragma once

#include <ATen/core/Tensor.h>

namespace perftrain::ops {

// qkv_attention(linear(h, qkv_weight, qkv_bias), heads) as one autograd
// function: h [B, T, D] in the compute dtype, qkv_weight [3D, D] and
// qkv_bias [3D] (may be undefined) as for ops::linear. Gradients as linear's.
// Falls back to exactly that composition where qkv_attention would not use
// cuDNN. On the fused paths (ours and cuDNN's) the key block of qkv_bias's
// gradient is exactly zero (softmax is shift-invariant per query; the
// composition gives rounding noise there). Bad shapes or dtypes throw
// UsageError.
at::Tensor projected_attention(const at::Tensor& h, const at::Tensor& qkv_weight, const at::Tensor& qkv_bias,
                               int64_t heads);

// The fp32 reference: linear_reference, then softmax attention in ATen math.
at::Tensor projected_attention_reference(const at::Tensor& h, const at::Tensor& qkv_weight,
                                         const at::Tensor& qkv_bias, int64_t heads);

}  // namespace perftrain::ops
