// Multi-head self-attention from a packed qkv projection, through the fused
// attention kernels PyTorch dispatches to (cuDNN / flash on Hopper); which one
// runs is visible in a profile (`perftrain bench --profile`), not chosen here.
#pragma once

#include <ATen/core/Tensor.h>

namespace perftrain::ops {

// qkv [B, T, 3*D] laid out as (3, heads, D/heads) in the last dim, as DiT's
// qkv Linear produces it -> [B, T, D]. The backward of the q/k/v split is one
// stack (unbind), not three zero-filled scatters (select). key_mask: a bool
// [B, 1, 1, T] "attend" mask on the keys (true: attended), or undefined.
at::Tensor self_attention(const at::Tensor& qkv, int64_t heads, const at::Tensor& key_mask = at::Tensor());

// The same on q, k, v [B, T, D] each (any strides): the three-tensor form of
// ops::qkv_attention falls back to it.
at::Tensor self_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t heads,
                          const at::Tensor& key_mask = at::Tensor());

}  // namespace perftrain::ops
