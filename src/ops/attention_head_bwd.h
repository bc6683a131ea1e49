// DRAFT (branch whole-head-attention, not yet run on a GPU): the attention
// backward of kernels/attention_head_bwd_sm90 behind projected_attention,
// where it applies (bf16 on sm_90, 256 tokens, head dim 64), instead of
// cuDNN's backward and its side passes. Off unless PERFTRAIN_ATTN_BWD=own
// (or set_own_attention_backward(true), for tests) until it has been
// measured against cuDNN on the H200.
#pragma once

#include <ATen/core/Tensor.h>

namespace perftrain::ops {

bool own_attention_backward();
void set_own_attention_backward(bool on);  // process-wide; before the step is captured

// The packed gradient of qkv [B, T, 3D] from cuDNN's forward outputs (out
// [B, H, T, d] in token-major memory, lse [B, H, T(, 1)] fp32) and the
// output's gradient [B, T, D]; undefined where the kernel does not apply.
at::Tensor try_attention_head_bwd(const at::Tensor& qkv, const at::Tensor& out, const at::Tensor& lse,
                                  const at::Tensor& grad_out, int64_t heads);

}  // namespace perftrain::ops
