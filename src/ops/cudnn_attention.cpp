#include "ops/cudnn_attention.h"

#include <ATen/ops/_scaled_dot_product_cudnn_attention.h>
#include <ATen/ops/_scaled_dot_product_cudnn_attention_backward.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>

#include <atomic>
#include <iostream>
#include <optional>
#include <string>
#include <tuple>
#include <utility>

#include "base/error.h"
#include "compat/compat.h"
#include "ops/attention_paths.h"

namespace perftrain::ops::detail {
namespace {

// Unmasked and masked attention are refused (and fall back) separately.
std::atomic<bool> unmasked_refused{false}, masked_refused{false};

}  // namespace

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

std::array<at::Tensor, 3> split_heads(const at::Tensor& qkv, int64_t heads) {
  const int64_t B = qkv.size(0), T = qkv.size(1), D = qkv.size(2) / 3;
  auto v5 = qkv.view({B, T, 3, heads, D / heads});
  return {v5.select(2, 0).transpose(1, 2), v5.select(2, 1).transpose(1, 2), v5.select(2, 2).transpose(1, 2)};
}

at::Tensor heads_view(const at::Tensor& x, int64_t heads) {
  return x.view({x.size(0), x.size(1), heads, x.size(2) / heads}).transpose(1, 2);
}

CudnnState cudnn_forward_state(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                               const at::Tensor& bias) {
  auto r = at::_scaled_dot_product_cudnn_attention(
      q, k, v, bias.defined() ? std::optional<at::Tensor>(bias) : std::nullopt, /*compute_log_sumexp=*/true);
  note_attention_path(AttentionPath::Cudnn, q.size(2), q.size(3), bias.defined(), q.scalar_type());
  // out [B, H, T, Dh], token-major in memory
  return {std::get<0>(r), std::get<1>(r), std::get<2>(r), std::get<3>(r), std::get<6>(r), std::get<7>(r),
          std::get<4>(r).expect_int(), std::get<5>(r).expect_int()};
}

at::Tensor cudnn_forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                         std::vector<at::Tensor> first_saved, const at::Tensor& bias) {
  const CudnnState state = cudnn_forward_state(q, k, v, bias);
  save_cudnn_state(ctx, std::move(first_saved), q, k, v, state, bias);
  return token_major(state.out);
}

at::Tensor cudnn_forward(AutogradContext* ctx, const at::Tensor& qkv, int64_t heads,
                         std::vector<at::Tensor> first_saved, const at::Tensor& bias) {
  auto [q, k, v] = split_heads(qkv, heads);
  return cudnn_forward(ctx, q, k, v, std::move(first_saved), bias);
}

void save_cudnn_state(AutogradContext* ctx, std::vector<at::Tensor> first_saved, const at::Tensor& q,
                      const at::Tensor& k, const at::Tensor& v, const CudnnState& st, const at::Tensor& bias) {
  first_saved.insert(first_saved.end(), {st.out, st.lse, st.cum_q, st.cum_k, st.seed, st.offset, bias, q, k, v});
  ctx->save_for_backward(first_saved);
  ctx->saved_data["max_q"] = st.max_q;
  ctx->saved_data["max_k"] = st.max_k;
}

std::array<at::Tensor, 3> cudnn_backward(const CudnnState& st, const at::Tensor& q, const at::Tensor& k,
                                         const at::Tensor& v, const at::Tensor& bias, const at::Tensor& grad_out) {
  const int64_t B = q.size(0), heads = q.size(1), T = q.size(2), Dh = q.size(3);
  // The output gradient in the output's own layout (cuDNN wants them alike).
  at::Tensor dout = grad_out.contiguous().view({B, T, heads, Dh}).transpose(1, 2);
  auto [dq, dk, dv] = at::_scaled_dot_product_cudnn_attention_backward(
      dout, q, k, v, st.out, st.lse, st.seed, st.offset, bias, st.cum_q, st.cum_k, st.max_q, st.max_k,
      /*dropout_p=*/0.0, /*is_causal=*/false);
  return {dq, dk, dv};
}

std::array<at::Tensor, 3> cudnn_backward(AutogradContext* ctx, const variable_list& s, size_t at,
                                         const at::Tensor& grad_out) {
  const CudnnState st{s[at],     s[at + 1], s[at + 2], s[at + 3], s[at + 4], s[at + 5],
                      ctx->saved_data["max_q"].toInt(), ctx->saved_data["max_k"].toInt()};
  return cudnn_backward(st, s[at + 7], s[at + 8], s[at + 9], s[at + 6], grad_out);
}

at::Tensor token_major(const at::Tensor& x) {
  return x.transpose(1, 2).reshape({x.size(0), x.size(2), x.size(1) * x.size(3)});
}

// dq, dk, dv [B, H, T, Dh] -> the packed [B, T, 3D] gradient of qkv. When
// each is token-major in memory ([B, T, D], as cuDNN writes them for the
// packed q, k, v views), one cat of three [B*T, 1, D] views into [B*T, 3, D]:
// one launch of ATen's batched cat kernel, which moves 16-byte vectors when D
// is a multiple of 8, instead of three strided element-wise copies of 2-byte
// elements (about 1.8 TB/s each on the H200). The same values either way.
// Otherwise (another layout) those copies.
at::Tensor pack_dqkv(const std::array<at::Tensor, 3>& d, int64_t B, int64_t T, int64_t heads, int64_t D) {
  std::vector<at::Tensor> rows;
  for (int64_t i = 0; i < 3; ++i) {
    const at::Tensor tm = d[i].transpose(1, 2);  // [B, T, H, Dh]
    if (!tm.is_contiguous()) break;
    rows.push_back(tm.view({B * T, 1, D}));
  }
  if (rows.size() == 3) return at::cat(rows, 1).view({B, T, 3 * D});
  at::Tensor dqkv = at::empty({B, T, 3, heads, D / heads}, d[0].options());
  for (int64_t i = 0; i < 3; ++i) dqkv.select(2, i).copy_(d[i].transpose(1, 2));
  return dqkv.view({B, T, 3 * D});
}

bool cudnn_refused(bool masked) { return (masked ? masked_refused : unmasked_refused).load(); }

bool cudnn_eligible(const at::Tensor& t, int64_t head_dim, bool masked) {
  const bool half = t.scalar_type() == at::kBFloat16 || t.scalar_type() == at::kHalf;
  const bool head_dim_taken = head_dim > 0 && head_dim % 8 == 0 && head_dim <= 128;
  return t.is_cuda() && half && head_dim_taken && !cudnn_refused(masked);
}

void note_refusal(const at::Tensor& qkv, const std::exception& e, bool masked) {
  (masked ? masked_refused : unmasked_refused).store(true);
  // One string, its numbers by std::to_string: written to std::cerr whole.
  std::string sizes;
  for (const int64_t s : qkv.sizes()) sizes += (sizes.empty() ? "" : ", ") + std::to_string(s);
  std::cerr << ("perftrain: cuDNN attention refused [" + sizes + "]" + (masked ? " with a key mask" : "") + " (" +
                compat::error_message(e) + "); using at::scaled_dot_product_attention\n");
}

void check_heads(const char* op, int64_t d, int64_t heads) {
  if (heads <= 0 || d % heads != 0)
    throw UsageError(std::string(op) + ": " + std::to_string(d) + " channels do not split into " +
                     std::to_string(heads) + " heads");
}

}  // namespace perftrain::ops::detail
