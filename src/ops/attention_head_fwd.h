// The attention forward of kernels/attention_head_fwd_sm90 behind
// projected_attention, where it applies (bf16 on sm_90, 256 tokens, head dim
// 64 or 72) and our backward will run too (it needs cuDNN's own forward
// state otherwise): about 0.8 of cuDNN's time per layer on the H200. On by
// default; set_whole_head_attention_forward(false) (the [speed] key attention =
// "cudnn") goes back to cuDNN.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <utility>

namespace perftrain::ops {

bool whole_head_attention_forward();
void set_whole_head_attention_forward(bool on);  // process-wide; before the step is captured

// Whether try_attention_head_fwd runs the kernel for qkv (both switches on,
// the shape, an sm_90 GPU): what a caller that keeps the forward's outputs
// for its own backward asks again there (python/csrc/ops_attention.cpp).
bool whole_head_attention_applies(const at::Tensor& qkv, int64_t heads);
// The attention of the packed projection qkv [B, T, 3D]: out [B, H, T, d]
// (token-major memory, as cuDNN's) and lse [B, H, T] fp32; both undefined
// where the kernel does not apply.
std::pair<at::Tensor, at::Tensor> try_attention_head_fwd(const at::Tensor& qkv, int64_t heads);

}  // namespace perftrain::ops
