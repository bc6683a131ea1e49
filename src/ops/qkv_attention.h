// Multi-head self-attention on a packed qkv projection [B, T, 3D] (or on q, k,
// v apart, each read in place), as an
// autograd function that reads q, k and v straight from the packed tensor and
// writes the output and the packed gradient in the token-major layouts the
// matrix products read, so that nothing is stacked or permuted in between
// (through three views and at::scaled_dot_product_attention, autograd would
// stack dq, dk, dv and permute them back: two copies that cost more than the
// attention). cuDNN's fused attention (ops/cudnn_attention.h, shared with
// ops/projected_attention.h, the qkv projection and attention as one op),
// and ATen's SDPA where cuDNN does not run (CPU, fp32, a shape it refuses).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <utility>

namespace perftrain::ops {

// qkv [B, T, 3*D] laid out as (3, heads, D/heads) in the last dim -> [B, T, D].
// CUDA bf16/fp16: cuDNN attention (with the [speed] key attention =
// "tiled", our tiled forward and backward, ops/attention_tiled);
// otherwise (CPU, fp32, or cuDNN refusing
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

// The same op on q, k, v [B, T, D] apart (one shape, dtype and device), each
// read in place through its row stride: the single-stream block's q and k
// from QK-norm + RoPE's dense q | k, and v as the column block of the qkv
// projection's output. Their gradients come back as cuDNN (or, with
// attention = "tiled", our tiled backward) writes them, [B, T, D] each,
// nothing packed. cuDNN or ours runs where the packed form's rules allow it
// and every input's last dimension is contiguous with rows evenly strided
// and 16-byte aligned; otherwise ATen's SDPA, as above.
at::Tensor qkv_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t heads,
                         const at::Tensor& key_mask = at::Tensor(), const at::Tensor& key_bias = at::Tensor());

// The packed form as two functions without an autograd context, for an
// operator whose gradient is another operator (the Python package's
// perftrain::attention and attention_backward): the same kernels as
// qkv_attention (our whole-head or tiled kernels, cuDNN's, "auto"'s plan,
// ATen's SDPA where none of those runs), chosen alike.
// qkv_attention_forward: (out [B, T, D] contiguous, lse [B, H, T] fp32: the
// log-sum-exp its backward reads, zeros where SDPA ran), under no grad.
// qkv_attention_backward: the packed gradient [B, T, 3D] from the forward's
// inputs and outputs; it makes the forward's choice again (the shape's plan
// is settled by then) and runs that family's backward; undefined where SDPA
// ran (the caller differentiates self_attention(qkv, heads, key_mask) on a
// recomputed forward: how depends on where it is called from).
std::pair<at::Tensor, at::Tensor> qkv_attention_forward(const at::Tensor& qkv, int64_t heads,
                                                        const at::Tensor& key_mask = at::Tensor());
at::Tensor qkv_attention_backward(const at::Tensor& grad_out, const at::Tensor& qkv, int64_t heads,
                                  const at::Tensor& key_mask, const at::Tensor& out, const at::Tensor& lse);

// The additive key bias qkv_attention gives cuDNN for a bool key mask [B, T]
// or [B, 1, 1, T]: [B, 1, 1, T] in dtype, 0 where attended and -65504
// elsewhere (no gradient). UsageError for a mask qkv_attention would refuse.
at::Tensor attention_key_bias(const at::Tensor& key_mask, at::ScalarType dtype);

// Whether cuDNN refused a shape in this process (unmasked or masked), after
// which qkv_attention runs ATen's SDPA for that kind (tests check it did not).
bool cudnn_attention_refused();

}  // namespace perftrain::ops
