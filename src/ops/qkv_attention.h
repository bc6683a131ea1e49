// Multi-head self-attention on a packed qkv projection [B, T, 3D], as autograd
// functions that read q, k and v straight from the packed tensor and write
// the output and the gradients in the token-major layouts the matrix products
// read, so that nothing is stacked or permuted in between (through three
// views and at::scaled_dot_product_attention, autograd would stack dq, dk, dv
// and permute them back: two copies that cost more than the attention).
//
// projected_attention owns the qkv projection too. The attention itself is
// our whole-head kernels where they apply (ops/attention_head_fwd and
// ops/attention_head_bwd: bf16 on sm_90, 256 tokens, head dim 64 or 72; the
// [speed] key attention = "own"), cuDNN's fused attention otherwise, and
// ATen's SDPA where cuDNN does not run (CPU, fp32, a shape it refuses). The
// backward feeds the packed gradient, or cuDNN's dq, dk, dv in place, straight
// to the projection's products (dW row block i = dQKV_i^T h, dh = sum_i
// dQKV_i W_i accumulated in place), so the gradients are never copied into
// another layout.
#pragma once

#include <ATen/core/Tensor.h>

namespace perftrain::ops {

// qkv [B, T, 3*D] laid out as (3, heads, D/heads) in the last dim -> [B, T, D].
// CUDA bf16/fp16: cuDNN attention; otherwise (CPU, fp32, or cuDNN refusing
// the shape once) self_attention(), ATen's SDPA under autograd. (Our
// whole-head kernels run inside projected_attention only.)
// key_mask: undefined, or a bool "attend" mask on the keys, [B, T] or
// [B, 1, 1, T] (true: the key is attended); every query must have at least
// one key to attend. cuDNN takes it as an additive bias in qkv's dtype
// (0 or -65504: a finite value, as ATen's SDPA gives cuDNN) in its forward
// and backward; masked keys get zero weight and zero k and v gradients.
// The mask takes no gradient and lives on qkv's device.
// key_bias: undefined (made from key_mask in each call that runs cuDNN), or
// attention_key_bias(key_mask, qkv's dtype) made once by the caller and
// passed to many calls on the same mask (a model's blocks): the same values
// without the three launches that make it. Given without key_mask, or of the
// wrong shape, dtype or device: UsageError.
at::Tensor qkv_attention(const at::Tensor& qkv, int64_t heads, const at::Tensor& key_mask = at::Tensor(),
                         const at::Tensor& key_bias = at::Tensor());

// The additive key bias qkv_attention gives cuDNN for a bool key mask [B, T]
// or [B, 1, 1, T]: [B, 1, 1, T] in dtype, 0 where attended and -65504
// elsewhere (no gradient). UsageError for a mask qkv_attention would refuse.
at::Tensor attention_key_bias(const at::Tensor& key_mask, at::ScalarType dtype);

// Whether cuDNN refused a shape in this process (unmasked or masked), after
// which qkv_attention runs ATen's SDPA for that kind (tests check it did not).
bool cudnn_attention_refused();

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
