#include "models/fused/dit_fused.h"

#include <ATen/ops/silu.h>

#include <utility>
#include <vector>

#include "compat/compat.h"
#include "models/fused/dit_block.h"
#include "ops/adaln_layernorm.h"
#include "ops/linear.h"
#include "ops/position_add.h"

namespace perftrain::models::fused {
namespace {

// The final layer's shift and scale from silu(c) in the compute dtype.
std::vector<at::Tensor> final_modulation(const FinalLayer& layer, const at::Tensor& silu_c) {
  const nn::Linear& l = layer.adaLN_modulation.linear();
  return ops::linear(silu_c, l.weight, l.bias).chunk(2, 1);  // shift, scale
}

// The final layer's product on its modulated norm h.
at::Tensor final_product(const FinalLayer& layer, const at::Tensor& h) {
  return ops::linear(h, layer.linear.weight, layer.linear.bias);
}

// The blocks and the final layer chained, from the embedded tokens x0.
at::Tensor chained(const DiT& model, const at::Tensor& x0, const at::Tensor& c, at::ScalarType act,
                   bool keep_activation, Fp8States* fp8) {
  // One SiLU and one cast of c for all blocks and the final layer.
  const at::Tensor silu_c = at::silu(c).to(act);
  std::vector<const DiTBlock*> blocks;
  for (size_t i = 0; i < model.blocks.size(); ++i) blocks.push_back(&model.blocks[i]);
  const DiTBlockSeq seq = own_weights(blocks);
  const std::vector<DiTModulation> mods = dit_modulations(seq, silu_c);
  // The last residual with the final layer's modulated norm; the residual
  // stream itself is not needed after it.
  return dit_blocks_chained(seq, mods, x0, act, keep_activation, [&](const GatedResidual& last) {
    return dit_final_layer_after(model.final_layer, last, silu_c, act);
  }, fp8);
}

}  // namespace

at::Tensor dit_final_layer_after(const FinalLayer& layer, const GatedResidual& last, const at::Tensor& silu_c,
                                 at::ScalarType act) {
  const auto fin = final_modulation(layer, silu_c);
  return final_product(layer, add_with_norm(last, fin[0], fin[1], act).second);
}

at::Tensor dit_forward(const DiT& model, const at::Tensor& x, const at::Tensor& c, const DiTExecution& exec) {
  const at::ScalarType act = compat::autocast_dtype(x.device().type()).value_or(x.scalar_type());
  at::Tensor h = ops::position_add(model.x_embedder.forward_as_product(x, act), model.pos_embed);  // contiguous [B, T, D]
  if (!exec.recompute && model.blocks.size() > 0) return chained(model, h, c, act, !exec.gelu_recompute, exec.fp8);
  return model.final_layer.forward(model.run_blocks(std::move(h), c, exec), c, exec);
}

at::Tensor dit_final_layer(const FinalLayer& layer, const at::Tensor& x, const at::Tensor& c) {
  const at::ScalarType act = compat::autocast_dtype(x.device().type()).value_or(x.scalar_type());
  const auto mod = final_modulation(layer, at::silu(c).to(act));
  return final_product(layer, ops::adaln_layernorm(x, mod[0], mod[1], act));
}

}  // namespace perftrain::models::fused
