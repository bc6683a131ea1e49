#include "nn/attention.h"

#include <ATen/ops/scaled_dot_product_attention.h>

namespace perftrain::nn {

SelfAttention::SelfAttention(int64_t hidden, int64_t heads, at::Generator& gen)
    : qkv(hidden, 3 * hidden, gen), proj(hidden, hidden, gen), heads_(heads) {
  register_module("qkv", &qkv);
  register_module("proj", &proj);
}

at::Tensor SelfAttention::forward(const at::Tensor& x) const {
  const int64_t B = x.size(0), N = x.size(1), C = x.size(2);
  auto qkv_heads = qkv.forward(x)                             // [B, N, 3C]
                       .reshape({B, N, 3, heads_, C / heads_})  // [B, N, 3, H, Dh]
                       .permute({2, 0, 3, 1, 4});               // [3, B, H, N, Dh]
  auto out = at::scaled_dot_product_attention(qkv_heads[0], qkv_heads[1], qkv_heads[2]);
  return proj.forward(out.transpose(1, 2).reshape({B, N, C}));  // [B, N, C]
}

}  // namespace perftrain::nn
