#include "nn/attention.h"

#include "ops/self_attention.h"

namespace perftrain::nn {

SelfAttention::SelfAttention(int64_t hidden, int64_t heads, at::Generator& gen)
    : qkv(hidden, 3 * hidden, gen), proj(hidden, hidden, gen), heads_(heads) {
  register_module("qkv", &qkv);
  register_module("proj", &proj);
}

at::Tensor SelfAttention::forward(const at::Tensor& x) const {
  return hooked({x}, [this](at::TensorList in) {
    return proj.forward(ops::self_attention(qkv.forward(in[0]), heads_));  // [B, N, C]
  });
}

}  // namespace perftrain::nn
