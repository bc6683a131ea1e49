// The attention forward of kernels/attention_head_fwd_sm90 behind
// projected_attention (0.143 ms against cuDNN's ~0.17 per DiT-B/2 b256
// layer, 0.281 against 0.37 per XL/2 layer on the H200), where it
// applies (bf16 on sm_90, 256 tokens, head dim 64 or 72) and our backward
// will run too (it needs cuDNN's own forward state otherwise). On unless
// PERFTRAIN_ATTN_FWD=cudnn (or set_own_attention_forward(false), for tests).
#pragma once

#include <ATen/core/Tensor.h>

#include <utility>

namespace perftrain::ops {

bool own_attention_forward();
void set_own_attention_forward(bool on);  // process-wide; before the step is captured

// PERFTRAIN_ATTN_FWD's value (nullptr when unset) as the switch: ours for
// unset or "own", cuDNN's for "cudnn"; std::invalid_argument otherwise.
bool own_attention_forward_from(const char* value);

// The attention of the packed projection qkv [B, T, 3D]: out [B, H, T, d]
// (token-major memory, as cuDNN's) and lse [B, H, T] fp32; both undefined
// where the kernel does not apply.
std::pair<at::Tensor, at::Tensor> try_attention_head_fwd(const at::Tensor& qkv, int64_t heads);

}  // namespace perftrain::ops
