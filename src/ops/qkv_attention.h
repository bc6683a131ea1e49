// Multi-head self-attention on a packed qkv projection as one autograd
// function around cuDNN's fused attention (forward and backward called
// directly). Why not at::scaled_dot_product_attention on three views: its
// backward returns dq, dk, dv as three tensors that autograd stacks and then
// permutes back into the packed layout, two copies that cost more than the
// attention itself (3.5 + 2.9 ms of a 41 ms DiT-S/2 b256 step, measured).
// Here cuDNN reads q, k, v straight from the packed tensor, writes its output
// and gradients in the token-major layout the next matrix product reads, and
// the gradients land in the packed layout with one strided copy each.
#pragma once

#include <ATen/core/Tensor.h>

namespace perftrain::ops {

// qkv [B, T, 3*D] laid out as (3, heads, D/heads) in the last dim -> [B, T, D].
// CUDA bf16/fp16: cuDNN attention; otherwise (CPU, fp32, or cuDNN refusing
// the shape once) self_attention(), ATen's SDPA under autograd.
at::Tensor qkv_attention(const at::Tensor& qkv, int64_t heads);

}  // namespace perftrain::ops
