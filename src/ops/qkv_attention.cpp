#include "ops/qkv_attention.h"

#include <ATen/ops/_scaled_dot_product_cudnn_attention.h>
#include <ATen/ops/_scaled_dot_product_cudnn_attention_backward.h>
#include <ATen/ops/empty.h>
#include <torch/csrc/autograd/custom_function.h>

#include <array>
#include <atomic>
#include <iostream>

#include "ops/compat.h"
#include "ops/self_attention.h"

namespace perftrain::ops {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// [B, T, 3D] -> q, k, v as [B, H, T, Dh] views (no copy).
std::array<at::Tensor, 3> split_heads(const at::Tensor& qkv, int64_t heads) {
  const int64_t B = qkv.size(0), T = qkv.size(1), D = qkv.size(2) / 3;
  auto v5 = qkv.view({B, T, 3, heads, D / heads});
  return {v5.select(2, 0).transpose(1, 2), v5.select(2, 1).transpose(1, 2), v5.select(2, 2).transpose(1, 2)};
}

struct CudnnAttention : torch::autograd::Function<CudnnAttention> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& qkv, int64_t heads) {
    auto [q, k, v] = split_heads(qkv, heads);
    auto r = at::_scaled_dot_product_cudnn_attention(q, k, v, /*attn_bias=*/std::nullopt,
                                                     /*compute_log_sumexp=*/true);
    const at::Tensor& out = std::get<0>(r);  // [B, H, T, Dh], token-major in memory
    ctx->save_for_backward({qkv, out, std::get<1>(r), std::get<2>(r), std::get<3>(r), std::get<6>(r),
                            std::get<7>(r)});
    ctx->saved_data["heads"] = heads;
    ctx->saved_data["max_q"] = std::get<4>(r).expect_int();
    ctx->saved_data["max_k"] = std::get<5>(r).expect_int();
    const int64_t B = qkv.size(0), T = qkv.size(1), D = qkv.size(2) / 3;
    return out.transpose(1, 2).reshape({B, T, D});
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto s = ctx->get_saved_variables();
    const at::Tensor &qkv = s[0], &out = s[1], &lse = s[2], &cum_q = s[3], &cum_k = s[4], &seed = s[5],
                     &offset = s[6];
    const int64_t heads = ctx->saved_data["heads"].toInt();
    const int64_t B = qkv.size(0), T = qkv.size(1), D = qkv.size(2) / 3;
    auto [q, k, v] = split_heads(qkv, heads);
    // The output gradient in the output's own layout (cuDNN wants them alike).
    at::Tensor dout = grads[0].contiguous().view({B, T, heads, D / heads}).transpose(1, 2);
    auto [dq, dk, dv] = at::_scaled_dot_product_cudnn_attention_backward(
        dout, q, k, v, out, lse, seed, offset, /*attn_bias=*/at::Tensor(), cum_q, cum_k,
        ctx->saved_data["max_q"].toInt(), ctx->saved_data["max_k"].toInt(), /*dropout_p=*/0.0,
        /*is_causal=*/false);
    at::Tensor dqkv = at::empty({B, T, 3, heads, D / heads}, qkv.options());
    dqkv.select(2, 0).copy_(dq.transpose(1, 2));
    dqkv.select(2, 1).copy_(dk.transpose(1, 2));
    dqkv.select(2, 2).copy_(dv.transpose(1, 2));
    return {dqkv.view({B, T, 3 * D}), at::Tensor()};
  }
};

std::atomic<bool> cudnn_refused{false};

}  // namespace

at::Tensor qkv_attention(const at::Tensor& qkv, int64_t heads) {
  const bool half = qkv.scalar_type() == at::kBFloat16 || qkv.scalar_type() == at::kHalf;
  if (!qkv.is_cuda() || !half || !qkv.is_contiguous() || cudnn_refused.load()) return self_attention(qkv, heads);
  try {
    return CudnnAttention::apply(qkv, heads);
  } catch (const std::exception& e) {
    // Once, before any capture (the first step runs eagerly): say so and use SDPA from now on.
    cudnn_refused.store(true);
    std::cerr << "perftrain: cuDNN attention refused " << qkv.sizes() << " (" << compat::error_message(e)
              << "); using at::scaled_dot_product_attention\n";
    return self_attention(qkv, heads);
  }
}

}  // namespace perftrain::ops
