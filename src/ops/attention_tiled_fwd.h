// The attention forward of kernels/attention_tiled_fwd_sm90 behind
// projected_attention and qkv_attention: bf16 on sm_90, any T >= 64 tokens,
// head dim 64 or 72, with or without a key bias (attention_key_bias's
// [B, 1, 1, T]). Its out and lse have the layouts of cuDNN's forward, so the
// backward that follows is cuDNN's (fed our out and lse), or at 256 tokens
// without a mask our whole-head backward (ops/attention_head_bwd). Off by
// default until measured on a GPU: set_tiled_attention_forward(true) (the
// [speed] key attention = "tiled") turns it on.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/csrc/autograd/custom_function.h>

#include <cstdint>
#include <utility>
#include <vector>

namespace perftrain::ops {

bool tiled_attention_forward();
void set_tiled_attention_forward(bool on);  // process-wide; before the step is captured

// Whether attention_tiled_fwd takes q, k, v: CUDA bf16 [B, T, D] views each
// with unit column stride, rows stride(1) apart (a multiple of 8) and samples
// T rows apart, D = heads * d, d 64 or 72, T >= 64; key_bias undefined or
// [B, 1, 1, T] fp32 or bf16 with unit last stride; an sm_90 GPU. The switch
// is not asked.
bool tiled_attention_takes(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t heads,
                           const at::Tensor& key_bias = at::Tensor());

// Softmax attention of q, k, v as above (q, k, v may be slices of one packed
// tensor: qkv.narrow(2, 0, D) etc.): out [B, H, T, d] (token-major memory,
// as cuDNN's) and lse [B, H, T] fp32. std::invalid_argument where
// tiled_attention_takes says no.
std::pair<at::Tensor, at::Tensor> attention_tiled_fwd(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                      int64_t heads, const at::Tensor& key_bias = at::Tensor());

namespace detail {

// The switch on and tiled_attention_takes the packed qkv [B, T, 3D] (and the bias).
bool tiled_attention_applies(const at::Tensor& qkv, int64_t heads, const at::Tensor& key_bias = at::Tensor());

// Our tiled forward on the packed qkv where tiled_attention_applies, saving
// in ctx what cuDNN's backward reads (cudnn_forward's layout after
// first_saved, our out and lse in place of cuDNN's), noting the path:
// the output [B, T, D]; undefined where it does not apply.
at::Tensor tiled_forward(torch::autograd::AutogradContext* ctx, const at::Tensor& qkv, int64_t heads,
                         std::vector<at::Tensor> first_saved, const at::Tensor& key_bias = at::Tensor());

}  // namespace detail

}  // namespace perftrain::ops
