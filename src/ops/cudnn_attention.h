// What qkv_attention (ops/qkv_attention.h) and projected_attention
// (ops/projected_attention.h) share, internal to src/ops: cuDNN's fused
// attention on a packed qkv [B, T, 3D], or on q, k, v apart, as pieces of an
// autograd function (q, k and v read in place as views, each with its own
// row stride; the output and the gradients left in
// the token-major layouts the matrix products read), and when cuDNN may run:
// its refusals, noted once per process and kind (unmasked, masked).
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/csrc/autograd/custom_function.h>

#include <array>
#include <exception>
#include <vector>

namespace perftrain::ops::detail {

// [B, T, 3D] -> q, k, v as [B, H, T, Dh] views (no copy).
std::array<at::Tensor, 3> split_heads(const at::Tensor& qkv, int64_t heads);
// [B, T, D] (last dimension contiguous) -> [B, H, T, Dh], a view.
at::Tensor heads_view(const at::Tensor& x, int64_t heads);
// [B, H, T, Dh] -> [B, T, D]: a view when x is token-major in memory (as
// cuDNN writes its output and gradients), else a copy.
at::Tensor token_major(const at::Tensor& x);

// cuDNN's forward on q, k, v [B, H, T, Dh] (views, each [B, T, D] in memory
// with its own row stride: the packed qkv's, or the projection's v beside a
// dense q | k): saves in ctx, after `first_saved` (tensors the caller saves
// first), out, lse, cuDNN's other outputs, the bias, q, k and v, and returns
// the output as [B, T, D] (a view: cuDNN writes it token-major). bias: the
// additive key bias [B, 1, 1, T] of attention_key_bias, or undefined.
at::Tensor cudnn_forward(torch::autograd::AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k,
                         const at::Tensor& v, std::vector<at::Tensor> first_saved,
                         const at::Tensor& bias = at::Tensor());
// The same on a packed qkv [B, T, 3D] (its three views).
at::Tensor cudnn_forward(torch::autograd::AutogradContext* ctx, const at::Tensor& qkv, int64_t heads,
                         std::vector<at::Tensor> first_saved, const at::Tensor& bias = at::Tensor());

// What cuDNN's backward reads of its forward: out [B, H, T, Dh]
// (token-major), lse [B, H, T, 1] fp32, the varlen offsets and dropout
// seeds (undefined for a dense forward, unread without dropout), and the
// token counts.
struct CudnnState {
  at::Tensor out, lse, cum_q, cum_k, seed, offset;
  int64_t max_q = 0, max_k = 0;
};

// cuDNN's forward on q, k, v [B, H, T, Dh] (as cudnn_forward reads them) and
// the bias, noting the path: its state, without a context (cudnn_forward
// saves it; qkv_attention_forward returns out and lse).
CudnnState cudnn_forward_state(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                               const at::Tensor& bias = at::Tensor());

// cuDNN's backward from a forward's state (cuDNN's own, or our tiled
// forward's out and lse in its layout) on q, k, v [B, H, T, Dh] and the
// bias: dq, dk, dv as [B, H, T, Dh], token-major. grad_out [B, T, D].
std::array<at::Tensor, 3> cudnn_backward(const CudnnState& state, const at::Tensor& q, const at::Tensor& k,
                                         const at::Tensor& v, const at::Tensor& bias, const at::Tensor& grad_out);

// Saves first_saved, then out, lse, cum_q, cum_k, seed, offset, bias, q, k
// and v (q, k, v as [B, H, T, Dh] views), with max_q and max_k in
// saved_data: the layout cudnn_backward reads (cudnn_forward's;
// ops/attention_tiled saves our forward's out and lse the same way).
void save_cudnn_state(torch::autograd::AutogradContext* ctx, std::vector<at::Tensor> first_saved,
                      const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const CudnnState& state,
                      const at::Tensor& bias);

// cuDNN's backward from what save_cudnn_state saved (starting at index `at`,
// the first after first_saved: out): dq, dk, dv as [B, H, T, Dh],
// token-major.
std::array<at::Tensor, 3> cudnn_backward(torch::autograd::AutogradContext* ctx,
                                         const torch::autograd::variable_list& saved, size_t at,
                                         const at::Tensor& grad_out);

// dq, dk, dv [B, H, T, Dh] -> the packed [B, T, 3D] gradient of qkv.
at::Tensor pack_dqkv(const std::array<at::Tensor, 3>& d, int64_t B, int64_t T, int64_t heads, int64_t D);

// Whether cuDNN may run on t: CUDA, bf16 or fp16, a head dim cuDNN's fused
// attention takes forward and backward (a multiple of 8, at most 128), and
// that kind (masked or not) not refused in this process. A head dim it does
// not take goes to ATen's SDPA without asking cuDNN, so that one odd call
// does not mark cuDNN refused for the rest of the process.
bool cudnn_eligible(const at::Tensor& t, int64_t head_dim, bool masked = false);
// Whether cuDNN refused that kind in this process.
bool cudnn_refused(bool masked);
// Once, before any capture (the first step runs eagerly): says so on stderr
// and marks that kind refused, so that ATen's SDPA runs from now on.
void note_refusal(const at::Tensor& qkv, const std::exception& e, bool masked = false);

// UsageError naming `op` unless d channels split into heads > 0 heads.
void check_heads(const char* op, int64_t d, int64_t heads);

}  // namespace perftrain::ops::detail
