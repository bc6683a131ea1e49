#include "ops/packed_attention_route.h"

#include <utility>

#include "ops/attention_choice.h"
#include "ops/attention_head_bwd.h"
#include "ops/attention_head_fwd.h"
#include "ops/attention_paths.h"
#include "ops/attention_tiled.h"
#include "ops/cudnn_attention.h"

namespace perftrain::ops::detail {

PackedAttentionPlan packed_attention_plan(const at::Tensor& qkv, int64_t heads, const at::Tensor& bias) {
  if (tiled_attention_applies(qkv, heads, bias)) return PackedAttentionPlan::Tiled;
  if (!bias.defined() && forced_attention_plan() == nullptr && whole_head_attention_applies(qkv, heads))
    return PackedAttentionPlan::WholeHead;
  return tiled_backward_after_cudnn_chosen(qkv, heads, bias) ? PackedAttentionPlan::CudnnThenTiledBackward
                                                             : PackedAttentionPlan::Cudnn;
}

at::Tensor packed_attention_forward(torch::autograd::AutogradContext* ctx, const at::Tensor& qkv, int64_t heads,
                                    std::vector<at::Tensor> first_saved, const at::Tensor& bias) {
  ctx->saved_data["heads"] = heads;
  ctx->saved_data["masked"] = bias.defined();
  ctx->saved_data["own_fwd"] = false;
  ctx->saved_data["tiled"] = false;
  const PackedAttentionPlan plan = packed_attention_plan(qkv, heads, bias);
  if (plan == PackedAttentionPlan::Tiled)
    if (at::Tensor tiled = tiled_forward(ctx, qkv, heads, first_saved, bias); tiled.defined()) return tiled;
  if (plan == PackedAttentionPlan::WholeHead) {
    auto [out, lse] = try_attention_head_fwd(qkv, heads);
    if (out.defined()) {
      const int64_t B = qkv.size(0), T = qkv.size(1), D = qkv.size(2) / 3;
      ctx->saved_data["own_fwd"] = true;
      note_attention_path(AttentionPath::Own, T, D / heads, false, qkv.scalar_type());
      first_saved.push_back(out);
      first_saved.push_back(lse);
      ctx->save_for_backward(first_saved);
      return out.transpose(1, 2).reshape({B, T, D});
    }
  }
  at::Tensor out = cudnn_forward(ctx, qkv, heads, std::move(first_saved), bias);
  if (plan == PackedAttentionPlan::CudnnThenTiledBackward) {
    ctx->saved_data["tiled"] = true;
    note_attention_path(AttentionPath::TiledBackward, qkv.size(1), qkv.size(2) / 3 / heads, bias.defined(),
                        qkv.scalar_type());
  }
  return out;
}

at::Tensor own_packed_attention_backward(torch::autograd::AutogradContext* ctx,
                                         const torch::autograd::variable_list& saved, size_t at,
                                         const at::Tensor& qkv, const at::Tensor& grad_out) {
  const int64_t heads = ctx->saved_data["heads"].toInt();
  const bool own_fwd = ctx->saved_data["own_fwd"].toBool();
  if (!ctx->saved_data["masked"].toBool() && (own_fwd || forced_attention_plan() == nullptr))
    if (at::Tensor dqkv = try_attention_head_bwd(qkv, saved[at], saved[at + 1], grad_out, heads, own_fwd);
        dqkv.defined())
      return dqkv;
  if (ctx->saved_data["tiled"].toBool()) return try_tiled_backward_packed(saved, at, grad_out);
  return at::Tensor();
}

}  // namespace perftrain::ops::detail
