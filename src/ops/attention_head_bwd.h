// The attention backward of kernels/attention_head_bwd_sm90 behind
// projected_attention, where it applies (bf16 on sm_90, 256 tokens, head dim
// 64 or 72: DiT-S/2, B/2 and XL/2 at 256 px), instead of cuDNN's backward
// and its side passes: 0.35 ms against cuDNN's 0.70 per DiT-B/2 b256 layer,
// 0.77 against 1.44 per XL/2 layer on the H200 (docs/PERFORMANCE.md). On by
// default; PERFTRAIN_ATTN_BWD=cudnn (or set_own_attention_backward(false),
// for tests) goes back to cuDNN, for the forward too.
#pragma once

#include <ATen/core/Tensor.h>

namespace perftrain::ops {

bool own_attention_backward();
void set_own_attention_backward(bool on);  // process-wide; before the step is captured

// PERFTRAIN_ATTN_BWD's value (nullptr when unset) as the switch: ours for
// unset or "own", cuDNN's for "cudnn"; std::invalid_argument otherwise, so
// that a misspelling is an error instead of a silent default.
bool own_attention_backward_from(const char* value);

// The packed gradient of qkv [B, T, 3D] from the forward's outputs (out
// [B, H, T, d] in token-major memory, lse [B, H, T(, 1)] fp32) and the
// output's gradient [B, T, D]; undefined where the kernel does not apply.
// forward_was_ours: the forward was ours (ops/attention_head_fwd), so there
// is no cuDNN state to fall back on: the switch is ignored, and a shape the
// kernel cannot take throws std::logic_error.
at::Tensor try_attention_head_bwd(const at::Tensor& qkv, const at::Tensor& out, const at::Tensor& lse,
                                  const at::Tensor& grad_out, int64_t heads, bool forward_was_ours = false);

}  // namespace perftrain::ops
