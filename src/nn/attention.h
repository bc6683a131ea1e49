// Multi-head self-attention with a fused qkv projection (names "qkv", "proj"
// as in timm's Attention, which the reference DiT uses). The attention itself
// is at::scaled_dot_product_attention, so the backend (flash, cuDNN,
// efficient, math) is chosen by ATen for the device and dtype.
#pragma once

#include "nn/linear.h"

namespace perftrain::nn {

class SelfAttention : public Module {
 public:
  SelfAttention(int64_t hidden, int64_t heads, at::Generator& gen);
  int64_t heads() const { return heads_; }
  at::Tensor forward(const at::Tensor& x) const;  // [B, N, hidden] -> [B, N, hidden]

  Linear qkv;
  Linear proj;

 private:
  int64_t heads_;
};

}  // namespace perftrain::nn
