// The tiled attention kernels (kernels/attention_tiled_fwd_sm90 and
// kernels/attention_tiled_bwd_sm90) behind projected_attention and
// qkv_attention: bf16 on sm_90, any T >= 64 tokens, head dim 64, 72, 96 or 128, with
// or without a key bias (attention_key_bias's [B, 1, 1, T]). The forward's
// out and lse have the layouts of cuDNN's, and the forward saves cuDNN's
// backward state too; the backward after it is ours (at 256 tokens without
// a mask our whole-head one, ops/attention_head_bwd), cuDNN's where ours
// does not take the output's gradient. Our backward also runs after cuDNN's
// forward, on cuDNN's out and lse, where "auto" chose that plan.
// set_tiled_attention(true) (the [speed] key attention = "tiled") turns
// both directions on; with "auto" (ops/attention_choice) they run the
// shapes and directions where they timed faster than cuDNN's.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/csrc/autograd/custom_function.h>

#include <array>
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

namespace perftrain::ops {

bool tiled_attention();
void set_tiled_attention(bool on);  // process-wide; before the step is captured

// Whether attention_tiled_fwd takes q, k, v: CUDA bf16 [B, T, D] views each
// with unit column stride, rows stride(1) apart (a multiple of 8) and samples
// T rows apart, D = heads * d, d 64, 72, 96 or 128, T >= 64; key_bias undefined or
// [B, 1, 1, T] fp32 or bf16 with unit last stride, 16-byte aligned, its rows a
// multiple of 16 bytes apart (attention_key_bias's); an sm_90 GPU. The switch
// is not asked.
bool tiled_attention_takes(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t heads,
                           const at::Tensor& key_bias = at::Tensor());

// Softmax attention of q, k, v as above (q, k, v may be slices of one packed
// tensor: qkv.narrow(2, 0, D) etc.): out [B, H, T, d] (token-major memory,
// as cuDNN's) and lse [B, H, T] fp32. std::invalid_argument where
// tiled_attention_takes says no.
std::pair<at::Tensor, at::Tensor> attention_tiled_fwd(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                      int64_t heads, const at::Tensor& key_bias = at::Tensor());

// The backward of attention_tiled_fwd: dq, dk, dv written into the given
// [B, T, D] bf16 views (unit column stride, rows a multiple of 8 apart,
// samples T rows apart: slices of the packed gradient, or of separate
// tensors), from q, k, v and key_bias as the forward took them, its out and
// lse, and the output's gradient [B, T, D] (made contiguous here).
// Deterministic: reruns give the same bits. std::invalid_argument where the
// kernel does not take them.
void attention_tiled_bwd(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t heads,
                         const at::Tensor& key_bias, const at::Tensor& out, const at::Tensor& lse,
                         const at::Tensor& grad_out, const at::Tensor& dq, const at::Tensor& dk, const at::Tensor& dv);

namespace detail {

// tiled_attention_takes q, k, v [B, T, D] (and the bias) and the switch is
// on, or with "auto" (ops/attention_choice) ours is this shape's choice;
// masked: whether a key mask comes (by default, whether key_bias is
// defined: a caller that makes the bias later says so).
bool tiled_attention_applies(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t heads,
                             const at::Tensor& key_bias = at::Tensor(), std::optional<bool> masked = std::nullopt);
// The same on a packed qkv [B, T, 3D] (its three column blocks).
bool tiled_attention_applies(const at::Tensor& qkv, int64_t heads, const at::Tensor& key_bias = at::Tensor(),
                             std::optional<bool> masked = std::nullopt);

// Our tiled forward on q, k, v [B, T, D] where tiled_attention_applies,
// saving in ctx what cuDNN's backward reads (save_cudnn_state's layout
// after first_saved, our out and lse in place of cuDNN's; saved_data
// "tiled" true), noting the path: the output [B, T, D]; undefined where it
// does not apply (saved_data "tiled" false).
at::Tensor tiled_forward(torch::autograd::AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k,
                         const at::Tensor& v, int64_t heads, std::vector<at::Tensor> first_saved,
                         const at::Tensor& key_bias = at::Tensor());
// The same on a packed qkv [B, T, 3D].
at::Tensor tiled_forward(torch::autograd::AutogradContext* ctx, const at::Tensor& qkv, int64_t heads,
                         std::vector<at::Tensor> first_saved, const at::Tensor& key_bias = at::Tensor());

// Whether, after cuDNN's forward on q, k, v [B, T, D] (and the bias), the
// backward is ours by the forced or "auto" plan, as below but not noted:
// the choice alone (ops/packed_attention_route's plan asks it before the
// forward runs).
bool tiled_backward_after_cudnn_chosen(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t heads,
                                       const at::Tensor& key_bias = at::Tensor());
// The same on a packed qkv [B, T, 3D].
bool tiled_backward_after_cudnn_chosen(const at::Tensor& qkv, int64_t heads,
                                       const at::Tensor& key_bias = at::Tensor());

// After cuDNN's forward on q, k, v [B, T, D] (and the bias, or none):
// whether the backward runs our tiled kernels on cuDNN's out and lse (a
// timing run's forced plan, else with "auto" this shape's plan, where
// tiled_attention_takes them); noted as the TiledBackward path when so. The
// caller saves the answer as the "tiled" flag.
bool tiled_backward_after_cudnn(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t heads,
                                const at::Tensor& key_bias = at::Tensor());
// The same on a packed qkv [B, T, 3D].
bool tiled_backward_after_cudnn(const at::Tensor& qkv, int64_t heads, const at::Tensor& key_bias = at::Tensor());

// attention_tiled_bwd after tiled_forward (or after cuDNN's forward where
// tiled_backward_after_cudnn said so), from what it saved (starting at
// index `at`, out's), the gradients dq, dk, dv [B, T, D] each, token-major
// (the three-tensor form's); undefined where the output's gradient is not bf16
// or the saved out and lse are not in the layouts the kernel reads (then
// cuDNN's backward runs on the same state).
std::array<at::Tensor, 3> try_tiled_backward(const torch::autograd::variable_list& saved, size_t at,
                                             const at::Tensor& grad_out);
// The same written into the packed gradient [B, T, 3D] of qkv.
at::Tensor try_tiled_backward_packed(const torch::autograd::variable_list& saved, size_t at,
                                     const at::Tensor& grad_out);

}  // namespace detail

}  // namespace perftrain::ops
