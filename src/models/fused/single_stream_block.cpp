#include "models/fused/single_stream_block.h"

#include <string>
#include <tuple>

#include "base/error.h"
#include "ops/linear.h"
#include "ops/qk_norm_rope.h"
#include "ops/qkv_attention.h"
#include "ops/residual_rms_adaln.h"
#include "ops/rms_adaln.h"
#include "ops/stacked_linear.h"
#include "ops/swiglu.h"

namespace perftrain::models::fused {
namespace {

// The four [B, D] vectors of chunks[4 * i .. 4 * i + 3].
SingleStreamModulation modulation_at(const std::vector<at::Tensor>& chunks, size_t i) {
  return {chunks[4 * i], chunks[4 * i + 1], chunks[4 * i + 2], chunks[4 * i + 3]};
}

}  // namespace

SingleStreamModulation single_stream_modulation(const SingleStreamBlock& block, const at::Tensor& silu_c) {
  return modulation_at(ops::linear(silu_c, block.adaLN_modulation.weight).chunk(4, 1), 0);
}

std::vector<SingleStreamModulation> single_stream_modulations(const SingleStreamBlockSeq& blocks,
                                                              const at::Tensor& silu_c) {
  std::vector<at::Tensor> weights;
  for (const SingleStreamBlock* b : blocks) weights.push_back(b->adaLN_modulation.weight);
  const std::vector<at::Tensor> chunks = ops::stacked_linear(silu_c, weights).chunk(int64_t(4 * blocks.size()), 1);
  std::vector<SingleStreamModulation> mods;
  for (size_t i = 0; i < blocks.size(); ++i) mods.push_back(modulation_at(chunks, i));
  return mods;
}

std::pair<at::Tensor, at::Tensor> add_with_rms_norm(const PostNormResidual& r, const at::Tensor& pre_weight,
                                                    const at::Tensor& scale, at::ScalarType act) {
  return ops::residual_rms_adaln(r.x, r.gate, r.y, r.post_weight, pre_weight, scale, act);
}

at::Tensor single_stream_attention(const SingleStreamAttention& attn, const at::Tensor& h,
                                   const SingleStreamContext& ctx) {
  const at::Tensor packed = ops::qk_norm_rope(ops::linear(h, attn.qkv.weight), attn.heads(), attn.q_norm.weight,
                                              attn.k_norm.weight, ctx.cos, ctx.sin);
  return ops::qkv_attention(packed, attn.heads(), ctx.mask, ctx.key_bias);  // [B, S, D]
}

std::pair<at::Tensor, at::Tensor> single_stream_attention_half(const SingleStreamBlock& block, const at::Tensor& x,
                                                               const at::Tensor& h, const SingleStreamModulation& mod,
                                                               const SingleStreamContext& ctx) {
  const at::Tensor a = ops::linear(single_stream_attention(block.attn, h, ctx), block.attn.proj.weight);
  return add_with_rms_norm({x, mod.attn_gate, a, block.attn_post_norm.weight}, block.ffn_norm.weight, mod.ffn_scale,
                           ctx.act);
}

at::Tensor single_stream_ffn_branch(const SingleStreamBlock& block, const at::Tensor& h2, bool keep_activation) {
  // gate and up in one product: their compute-dtype weights stacked [2F, D]
  // (a view where the bf16 copies of gate and up lie back to back, as the
  // device optimizer places them; else a copy), and each weight gets its row
  // block of the gradient.
  const nn::SwiGLU& ffn = block.ffn;
  const at::Tensor gate_up = ops::stacked_linear(h2, {ffn.gate.weight, ffn.up.weight});  // [B, S, 2F]
  return keep_activation ? ops::linear(ops::swiglu(gate_up), ffn.down.weight)
                         : ops::swiglu_linear(gate_up, ffn.down.weight);
}

at::Tensor single_stream_block(const SingleStreamBlock& block, const at::Tensor& x, const at::Tensor& silu_c,
                               const SingleStreamContext& ctx) {
  const SingleStreamModulation mod = single_stream_modulation(block, silu_c);
  const at::Tensor h = ops::rms_adaln(x, block.attn_norm.weight, mod.attn_scale, ctx.act);
  auto [x1, h2] = single_stream_attention_half(block, x, h, mod, ctx);
  // No next pre-norm here: its h is left unused.
  return add_with_rms_norm({x1, mod.ffn_gate, single_stream_ffn_branch(block, h2, ctx.keep_activation),
                            block.ffn_post_norm.weight},
                           at::Tensor(), at::Tensor(), ctx.act)
      .first;
}

at::Tensor single_stream_blocks_chained(const SingleStreamBlockSeq& blocks,
                                        const std::vector<SingleStreamModulation>& mods, const at::Tensor& x0,
                                        const SingleStreamContext& ctx, const CloseSingleStreamChain& close) {
  if (blocks.empty() || mods.size() != blocks.size())
    throw RuntimeError("single_stream_blocks_chained: " + std::to_string(blocks.size()) + " blocks and " +
                       std::to_string(mods.size()) + " modulations (one per block, at least one)");
  at::Tensor x = x0;
  at::Tensor h = ops::rms_adaln(x, blocks[0]->attn_norm.weight, mods[0].attn_scale, ctx.act);
  for (size_t i = 0;; ++i) {
    const SingleStreamBlock& b = *blocks[i];
    auto [x1, h2] = single_stream_attention_half(b, x, h, mods[i], ctx);
    const PostNormResidual ffn_residual{x1, mods[i].ffn_gate, single_stream_ffn_branch(b, h2, ctx.keep_activation),
                                        b.ffn_post_norm.weight};
    if (i + 1 == blocks.size()) return close(ffn_residual);
    std::tie(x, h) = add_with_rms_norm(ffn_residual, blocks[i + 1]->attn_norm.weight, mods[i + 1].attn_scale, ctx.act);
  }
}

}  // namespace perftrain::models::fused
