#include "models/fused/single_stream_fused.h"

#include <ATen/ops/cat.h>

#include <vector>

#include "compat/compat.h"
#include "models/fused/single_stream_block.h"
#include "ops/linear.h"
#include "ops/qkv_attention.h"
#include "ops/recompute.h"
#include "ops/rms_adaln.h"

namespace perftrain::models::fused {
namespace {

// All blocks and the final layer chained: x0 [B, S, D] fp32 -> [B, S, p*p*out].
at::Tensor chained(const SingleStreamDiT& model, const at::Tensor& x0, const at::Tensor& silu_c,
                   const SingleStreamContext& ctx) {
  std::vector<const SingleStreamBlock*> blocks;
  for (size_t i = 0; i < model.blocks.size(); ++i) blocks.push_back(&model.blocks[i]);
  const SingleStreamBlockSeq seq = own_weights(blocks);
  const std::vector<SingleStreamModulation> mods = single_stream_modulations(seq, silu_c);
  // The final layer's [D, D] weight lies apart from the blocks' stacked
  // copies: its own small product rather than a copy of all the others.
  const at::Tensor final_scale = single_stream_final_scale(model.final_layer, silu_c);
  return single_stream_blocks_chained(seq, mods, x0, ctx, [&](const PostNormResidual& last) {
    return single_stream_final_layer_after(model.final_layer, last, final_scale, ctx.act);
  });
}

// Block by block (under recompute: each block's activations made again in
// backward), then the final layer, on all tokens as in the chained path.
at::Tensor one_by_one(const SingleStreamDiT& model, at::Tensor x, const at::Tensor& silu_c,
                      const SingleStreamContext& ctx, bool recompute) {
  for (size_t i = 0; i < model.blocks.size(); ++i) {
    const SingleStreamBlock& block = model.blocks[i];
    // backward may call fn again after this forward returned: captures by value.
    auto fn = [&block, ctx](const at::Tensor& xx, const at::Tensor& c) {
      return single_stream_block(block, weights_of(block), xx, c, ctx);
    };
    x = recompute ? ops::recompute(fn, x, silu_c) : fn(x, silu_c);
  }
  return single_stream_final_layer(model.final_layer, x, silu_c, ctx.act);
}

}  // namespace

at::Tensor single_stream_final_scale(const SingleStreamFinalLayer& layer, const at::Tensor& silu_c) {
  return ops::linear(silu_c, layer.adaLN_modulation.weight);  // [B, D]
}

at::Tensor single_stream_final_layer_after(const SingleStreamFinalLayer& layer, const PostNormResidual& last,
                                           const at::Tensor& final_scale, at::ScalarType act) {
  // The final layer's norm (no weight) and scale; the residual stream itself
  // is not needed after it. The product runs on all tokens (its output is
  // p*p*out narrow) and the caller keeps the image tokens.
  const at::Tensor hf = add_with_rms_norm(last, at::Tensor(), final_scale, act).second;
  return ops::linear(hf, layer.linear.weight);
}

at::Tensor single_stream_final_layer(const SingleStreamFinalLayer& layer, const at::Tensor& x,
                                     const at::Tensor& silu_c, at::ScalarType act) {
  const at::Tensor h = ops::rms_adaln(x, at::Tensor(), single_stream_final_scale(layer, silu_c), act);
  return ops::linear(h, layer.linear.weight);
}

at::Tensor single_stream_tokens(const nn::Linear& x_embedder, const at::Tensor& patches, const at::Tensor& ctok,
                                at::ScalarType act) {
  // The residual stream in fp32 whatever the compute dtype (as DiT's).
  const at::Tensor img = ops::linear(patches.to(act), x_embedder.weight);  // [B, T, D]
  return at::cat({ctok.to(at::kFloat), img.to(at::kFloat)}, 1);             // [B, Tc + T, D]
}

SingleStreamContext single_stream_context(const at::Tensor& cos, const at::Tensor& sin, const at::Tensor& mask,
                                          at::ScalarType act, bool keep_activation) {
  // The key mask as the attention's additive bias, made once for all blocks.
  return {cos, sin, mask, mask.defined() ? ops::attention_key_bias(mask, act) : at::Tensor(), act, keep_activation};
}

at::Tensor single_stream_forward(const SingleStreamDiT& model, const at::Tensor& patches, const at::Tensor& ctok,
                                 const at::Tensor& mask, const at::Tensor& silu_c_in, const DiTExecution& exec) {
  const int64_t Tc = model.config().cond_tokens, T = model.config().tokens();
  const at::ScalarType act = compat::autocast_dtype(patches.device().type()).value_or(patches.scalar_type());
  const at::Tensor x0 = single_stream_tokens(model.x_embedder, patches, ctok, act);
  const at::Tensor silu_c = silu_c_in.to(act);
  SingleStreamContext ctx = single_stream_context(model.rope_cos.to(patches.device()),
                                                  model.rope_sin.to(patches.device()), mask, act, !exec.gelu_recompute);
  ctx.fp8 = exec.fp8;
  if (!exec.recompute && model.blocks.size() > 0) return chained(model, x0, silu_c, ctx).narrow(1, Tc, T);
  return one_by_one(model, x0, silu_c, ctx, exec.recompute).narrow(1, Tc, T);
}

}  // namespace perftrain::models::fused
