// The attention backward of kernels/attention_head_bwd_sm90 behind
// projected_attention, where it applies (bf16 on sm_90, 256 tokens, head dim
// 64 or 72: DiT-S/2, B/2 and XL/2 at 256 px), instead of cuDNN's backward
// and its side passes: about half cuDNN's time per layer on the H200. On by
// default; set_whole_head_attention_backward(false) (the [speed] key attention =
// "cudnn") goes back to cuDNN, for the forward too.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace perftrain::ops {

bool whole_head_attention_backward();
void set_whole_head_attention_backward(bool on);  // process-wide; before the step is captured

// The packed gradient of qkv [B, T, 3D] from the forward's outputs (out
// [B, H, T, d] in token-major memory, lse [B, H, T(, 1)] fp32) and the
// output's gradient [B, T, D]; undefined where the kernel does not apply.
// forward_was_ours: the forward was ours (ops/attention_head_fwd), so there
// is no cuDNN state to fall back on: the switch is ignored, and a shape the
// kernel cannot take throws std::logic_error.
at::Tensor try_attention_head_bwd(const at::Tensor& qkv, const at::Tensor& out, const at::Tensor& lse,
                                  const at::Tensor& grad_out, int64_t heads, bool forward_was_ours = false);

namespace detail {

// The head dim d when the whole-head kernels (forward and backward) take
// qkv: a contiguous CUDA bf16 [B, 256, 3D] with D = heads * d, d 64 or 72;
// 0 otherwise. The GPU's architecture is not checked here.
int64_t whole_head_dim(const at::Tensor& qkv, int64_t heads);

}  // namespace detail

}  // namespace perftrain::ops
