#include "models/fused/single_stream_block.h"

#include <ATen/TensorOperators.h>

#include <string>
#include <tuple>
#include <vector>

#include "base/error.h"
#include "base/scope.h"
#include "ops/linear.h"
#include "ops/qk_norm_rope.h"
#include "ops/qkv_attention.h"
#include "ops/residual_rms_adaln.h"
#include "ops/rms_adaln.h"
#include "ops/stacked_linear.h"
#include "ops/swiglu.h"

namespace perftrain::models::fused {

std::vector<SingleStreamModulation> split_single_stream_modulations(const at::Tensor& product, size_t count) {
  const std::vector<at::Tensor> c = product.chunk(int64_t(4 * count), -1);
  std::vector<SingleStreamModulation> mods;
  for (size_t i = 0; i < count; ++i) mods.push_back({c[4 * i], c[4 * i + 1], c[4 * i + 2], c[4 * i + 3]});
  return mods;
}

SingleStreamModulation single_stream_modulation(const SingleStreamBlockWeights& w, const at::Tensor& silu_c) {
  return split_single_stream_modulations(ops::linear(silu_c, w.ada_w), 1)[0];
}

std::vector<SingleStreamModulation> single_stream_modulations(const SingleStreamBlockSeq& seq,
                                                              const at::Tensor& silu_c) {
  if (seq.empty()) return {};
  std::vector<at::Tensor> weights;
  for (const SingleStreamApplication& a : seq) weights.push_back(a.weights.ada_w);
  return split_single_stream_modulations(ops::stacked_linear(silu_c, weights), seq.size());
}

std::pair<at::Tensor, at::Tensor> add_with_rms_norm(const PostNormResidual& r, const at::Tensor& pre_weight,
                                                    const at::Tensor& scale, at::ScalarType act) {
  return ops::residual_rms_adaln(r.x, r.gate, r.y, r.post_weight, pre_weight, scale, act);
}

ops::Fp8Operand open_linear_rms_norm(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& scale,
                                     at::ScalarType act, const Fp8Block& f, const char* layer, int64_t out_features) {
  if (const auto target = block_linear_target(f, layer, x, out_features))
    return ops::rms_adaln_fp8(x, weight, scale, act, *target);
  return {ops::rms_adaln(x, weight, scale, act), at::Tensor()};
}

std::pair<at::Tensor, ops::Fp8Operand> add_with_linear_rms_norm(const PostNormResidual& r,
                                                                const at::Tensor& pre_weight, const at::Tensor& scale,
                                                                at::ScalarType act, const Fp8Block& f,
                                                                const char* layer, int64_t out_features) {
  if (const auto target = block_linear_target(f, layer, r.x, out_features))
    return ops::residual_rms_adaln_fp8(r.x, r.gate, r.y, r.post_weight, pre_weight, scale, act, *target);
  auto [x1, h] = add_with_rms_norm(r, pre_weight, scale, act);
  return {std::move(x1), ops::Fp8Operand{std::move(h), at::Tensor()}};
}

at::Tensor single_stream_attention(const SingleStreamAttention& attn, const at::Tensor& qkv_w,
                                   const ops::Fp8Operand& h, const SingleStreamContext& ctx, const Fp8Block& fp8) {
  // The projection's output stays where it is: q | k (its first 2D columns)
  // read in place by QK-norm + RoPE, v by attention; backward, each block's
  // gradient reaches the projection's products as it was written. In fp8 the
  // product is one fp8_linear and its columns are read as views of it.
  const int64_t d = qkv_w.size(0) / 3;
  std::vector<at::Tensor> qk_v;
  if (fp8.states != nullptr) {
    const at::Tensor qkv = block_linear(fp8, "attn.qkv", h, qkv_w);
    qk_v = {qkv.narrow(-1, 0, 2 * d), qkv.narrow(-1, 2 * d, d)};
  } else {
    qk_v = ops::linear_column_blocks(h.x, qkv_w, at::Tensor(), {2 * d, d});
  }
  const auto [q, k] =
      ops::qk_norm_rope(qk_v[0], attn.heads(), attn.q_norm.weight, attn.k_norm.weight, ctx.cos, ctx.sin);
  return ops::qkv_attention(q, k, qk_v[1], attn.heads(), ctx.mask, ctx.key_bias);  // [B, S, D]
}

std::pair<at::Tensor, ops::Fp8Operand> single_stream_attention_half(const SingleStreamBlock& block,
                                                                    const SingleStreamBlockWeights& w,
                                                                    const at::Tensor& x, const ops::Fp8Operand& h,
                                                                    const SingleStreamModulation& mod,
                                                                    const SingleStreamContext& ctx,
                                                                    const Fp8Block& fp8) {
  const at::Tensor a = block_linear(fp8, "attn.proj", single_stream_attention(block.attn, w.qkv_w, h, ctx, fp8), w.proj_w);
  return add_with_linear_rms_norm({x, mod.attn_gate, a, block.attn_post_norm.weight}, block.ffn_norm.weight,
                                  mod.ffn_scale, ctx.act, fp8, "ffn.gate_up", w.gate_w.size(0) + w.up_w.size(0));
}

at::Tensor single_stream_ffn_branch(const SingleStreamBlockWeights& w, const ops::Fp8Operand& h2,
                                    bool keep_activation, const Fp8Block& fp8) {
  if (fp8.states != nullptr) {
    // gate and up as the row blocks of one weight: cast in place, no
    // concatenation; SwiGLU in the casts on either side where both products
    // run in fp8 (ops/fp8_linear_swiglu.h), else on its own.
    if (const auto h = block_linear_swiglu(fp8, "ffn.gate_up", h2, {w.gate_w, w.up_w}, "ffn.down", w.down_w.size(0)))
      return block_linear(fp8, "ffn.down", *h, w.down_w);
    const at::Tensor gate_up = block_linear(fp8, "ffn.gate_up", h2, {w.gate_w, w.up_w});  // [B, S, 2F]
    return block_linear(fp8, "ffn.down", ops::swiglu(gate_up), w.down_w);
  }
  // gate and up in one product: their compute-dtype weights stacked [2F, D]
  // (a view where the bf16 copies of gate and up lie back to back, as the
  // device optimizer places a block's own; else a copy), and each weight
  // gets its row block of the gradient; SwiGLU runs in the product's
  // epilogue where it can (ops/swiglu.h). Not keeping the activation, only
  // gate_up [B, S, 2F] is kept and the activation made again in backward.
  if (keep_activation) return ops::linear(ops::swiglu_product(h2.x, w.gate_w, w.up_w), w.down_w);
  return ops::swiglu_product_linear(h2.x, w.gate_w, w.up_w, w.down_w);
}

at::Tensor single_stream_block(const SingleStreamBlock& block, const SingleStreamBlockWeights& w, const at::Tensor& x,
                               const at::Tensor& silu_c, const SingleStreamContext& ctx) {
  const SingleStreamModulation mod = single_stream_modulation(w, silu_c);
  const at::Tensor h = ops::rms_adaln(x, block.attn_norm.weight, mod.attn_scale, ctx.act);
  auto [x1, h2] = single_stream_attention_half(block, w, x, {h, at::Tensor()}, mod, ctx);
  // No next pre-norm here: its h is left unused.
  return add_with_rms_norm(
             {x1, mod.ffn_gate, single_stream_ffn_branch(w, h2, ctx.keep_activation), block.ffn_post_norm.weight},
             at::Tensor(), at::Tensor(), ctx.act)
      .first;
}

at::Tensor single_stream_blocks_chained(const SingleStreamBlockSeq& seq,
                                        const std::vector<SingleStreamModulation>& mods, const at::Tensor& x0,
                                        const SingleStreamContext& ctx, const CloseSingleStreamChain& close) {
  if (seq.empty() || mods.size() != seq.size())
    throw RuntimeError("single_stream_blocks_chained: " + std::to_string(seq.size()) + " blocks and " +
                       std::to_string(mods.size()) + " modulations (one per block, at least one)");
  at::Tensor x = seq[0].enter_add.defined() ? x0 + seq[0].enter_add : x0;
  ops::Fp8Operand h = open_linear_rms_norm(x, seq[0].block->attn_norm.weight, mods[0].attn_scale, ctx.act,
                                           {ctx.fp8, seq[0].key}, "attn.qkv", seq[0].weights.qkv_w.size(0));
  for (size_t i = 0;; ++i) {
    const auto [scope, index] = scope_of(seq[i], i);
    PERFTRAIN_SCOPE_INDEXED(scope, index);
    const SingleStreamBlock& b = *seq[i].block;
    const SingleStreamBlockWeights& w = seq[i].weights;
    const Fp8Block f{ctx.fp8, seq[i].key};
    auto [x1, h2] = single_stream_attention_half(b, w, x, h, mods[i], ctx, f);
    PostNormResidual ffn_residual{x1, mods[i].ffn_gate, single_stream_ffn_branch(w, h2, ctx.keep_activation, f),
                                  b.ffn_post_norm.weight};
    if (i + 1 == seq.size()) return close(ffn_residual);
    if (seq[i + 1].enter_add.defined()) ffn_residual.x = x1 + seq[i + 1].enter_add;
    std::tie(x, h) = add_with_linear_rms_norm(ffn_residual, seq[i + 1].block->attn_norm.weight,
                                              mods[i + 1].attn_scale, ctx.act, {ctx.fp8, seq[i + 1].key}, "attn.qkv",
                                              seq[i + 1].weights.qkv_w.size(0));
  }
}

}  // namespace perftrain::models::fused
