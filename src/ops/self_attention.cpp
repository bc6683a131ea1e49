#include "ops/self_attention.h"

#include <ATen/ops/scaled_dot_product_attention.h>
#include <ATen/ops/unbind.h>

#include <optional>

namespace perftrain::ops {

at::Tensor self_attention(const at::Tensor& qkv, int64_t heads, const at::Tensor& key_mask) {
  const int64_t B = qkv.size(0), T = qkv.size(1), D = qkv.size(2) / 3;
  auto qkv_heads = at::unbind(qkv.view({B, T, 3, heads, D / heads}).permute({2, 0, 3, 1, 4}), 0);  // 3 x [B,H,T,Dh]
  const std::optional<at::Tensor> mask = key_mask.defined() ? std::optional<at::Tensor>(key_mask) : std::nullopt;
  auto out = at::scaled_dot_product_attention(qkv_heads[0], qkv_heads[1], qkv_heads[2], mask);  // [B, H, T, Dh]
  return out.transpose(1, 2).reshape({B, T, D});
}

}  // namespace perftrain::ops
