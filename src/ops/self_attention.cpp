#include "ops/self_attention.h"

#include <ATen/core/grad_mode.h>
#include <ATen/ops/_scaled_dot_product_efficient_attention.h>
#include <ATen/ops/scaled_dot_product_attention.h>
#include <ATen/ops/unbind.h>
#include <ATen/ops/zeros.h>

#include <limits>

#include <optional>

#include "ops/attention_paths.h"

namespace perftrain::ops {

namespace {

// The attention of q, k, v [B, H, T, Dh] -> [B, T, D].
at::Tensor attend(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& key_mask) {
  const int64_t B = q.size(0), H = q.size(1), T = q.size(2), Dh = q.size(3), D = H * Dh;
  const std::optional<at::Tensor> mask = key_mask.defined() ? std::optional<at::Tensor>(key_mask) : std::nullopt;
  // A key mask on CUDA bf16/fp16: the memory-efficient kernel by name. ATen's
  // SDPA picks cuDNN for a masked bf16 call in 2.11, whose backward turns dq
  // NaN at T % 128 == 64 (PyTorch issue 196678), and qkv_attention sends
  // exactly those token counts here. The bias is ATen's own conversion of a
  // bool mask (0 or -inf); the kernel reads it through its strides, so the
  // [B, 1, 1, T] mask is expanded, not copied (rows T elements apart: T % 16 == 0).
  const bool half = q.scalar_type() == at::kBFloat16 || q.scalar_type() == at::kHalf;
  if (mask && q.is_cuda() && half && key_mask.dim() == 4 && T % 16 == 0) {
    const at::Tensor bias = at::zeros(key_mask.sizes(), q.options())
                                .masked_fill(key_mask.logical_not(), -std::numeric_limits<float>::infinity())
                                .expand({B, H, T, T});
    const bool lse = at::GradMode::is_enabled() && (q.requires_grad() || k.requires_grad() || v.requires_grad());
    auto res = at::_scaled_dot_product_efficient_attention(q, k, v, bias, lse);
    note_attention_path(AttentionPath::Efficient, T, Dh, true, q.scalar_type());
    return std::get<0>(res).transpose(1, 2).reshape({B, T, D});
  }
  auto out = at::scaled_dot_product_attention(q, k, v, mask);  // [B, H, T, Dh]
  note_attention_path(AttentionPath::Sdpa, T, Dh, mask.has_value(), q.scalar_type());
  return out.transpose(1, 2).reshape({B, T, D});
}

// [B, T, D] -> [B, H, T, Dh] (a view where the last dimension is contiguous).
at::Tensor by_heads(const at::Tensor& x, int64_t heads) {
  return x.reshape({x.size(0), x.size(1), heads, x.size(2) / heads}).transpose(1, 2);
}

}  // namespace

at::Tensor self_attention(const at::Tensor& qkv, int64_t heads, const at::Tensor& key_mask) {
  const int64_t B = qkv.size(0), T = qkv.size(1), D = qkv.size(2) / 3;
  auto qkv_heads = at::unbind(qkv.view({B, T, 3, heads, D / heads}).permute({2, 0, 3, 1, 4}), 0);  // 3 x [B,H,T,Dh]
  return attend(qkv_heads[0], qkv_heads[1], qkv_heads[2], key_mask);
}

at::Tensor self_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t heads,
                          const at::Tensor& key_mask) {
  return attend(by_heads(q, heads), by_heads(k, heads), by_heads(v, heads), key_mask);
}

}  // namespace perftrain::ops
