#include "models/fused/dit_block.h"

#include <ATen/ops/silu.h>

#include <string>
#include <tuple>

#include "base/error.h"
#include "base/scope.h"
#include "compat/compat.h"
#include "ops/adaln_layernorm.h"
#include "ops/gated_residual.h"
#include "ops/gelu_mlp.h"
#include "ops/linear.h"
#include "ops/projected_attention.h"
#include "ops/residual_adaln.h"
#include "ops/stacked_linear.h"

namespace perftrain::models::fused {
namespace {

// The six [B, D] vectors of chunks[6 * i .. 6 * i + 5].
DiTModulation modulation_at(const std::vector<at::Tensor>& chunks, size_t i) {
  return {chunks[6 * i], chunks[6 * i + 1], chunks[6 * i + 2], chunks[6 * i + 3], chunks[6 * i + 4], chunks[6 * i + 5]};
}

}  // namespace

DiTModulation dit_modulation(const DiTBlock& block, const at::Tensor& silu_c) {
  const nn::Linear& l = block.adaLN_modulation.linear();
  return modulation_at(ops::linear(silu_c, l.weight, l.bias).chunk(6, 1), 0);
}

std::vector<DiTModulation> dit_modulations(const DiTBlockSeq& blocks, const at::Tensor& silu_c) {
  std::vector<at::Tensor> weights, biases;
  for (const DiTBlock* b : blocks) {
    weights.push_back(b->adaLN_modulation.linear().weight);
    biases.push_back(b->adaLN_modulation.linear().bias);
  }
  const std::vector<at::Tensor> chunks = ops::stacked_linear(silu_c, weights, biases).chunk(6 * blocks.size(), 1);
  std::vector<DiTModulation> mods;
  for (size_t i = 0; i < blocks.size(); ++i) mods.push_back(modulation_at(chunks, i));
  return mods;
}

std::pair<at::Tensor, at::Tensor> add_with_norm(const GatedResidual& r, const at::Tensor& shift,
                                                const at::Tensor& scale, at::ScalarType act) {
  return ops::residual_adaln(r.x, r.gate, r.y, shift, scale, act, 1e-6, r.bias);
}

std::pair<at::Tensor, at::Tensor> dit_attention_half(const DiTBlock& block, const at::Tensor& x, const at::Tensor& h,
                                                     const DiTModulation& mod, at::ScalarType act) {
  const nn::SelfAttention& attn = block.attn;
  const at::Tensor a = ops::projected_attention(h, attn.qkv.weight, attn.qkv.bias, attn.heads());  // [B, T, D] act
  return add_with_norm({x, mod.gate_msa, ops::linear(a, attn.proj.weight), attn.proj.bias}, mod.shift_mlp,
                       mod.scale_mlp, act);
}

at::Tensor dit_mlp_half(const DiTBlock& block, const at::Tensor& h2, bool keep_activation) {
  const nn::Mlp& mlp = block.mlp;
  return ops::gelu_mlp(h2, mlp.fc1.weight, mlp.fc1.bias, mlp.fc2.weight, at::Tensor(), keep_activation);  // [B, T, D]
}

at::Tensor dit_block(const DiTBlock& block, const at::Tensor& x, const at::Tensor& c, const DiTExecution& exec) {
  const at::ScalarType act = compat::autocast_dtype(x.device().type()).value_or(x.scalar_type());
  const DiTModulation mod = dit_modulation(block, at::silu(c).to(act));
  auto [x1, h2] = dit_attention_half(block, x, ops::adaln_layernorm(x, mod.shift_msa, mod.scale_msa, act), mod, act);
  return ops::gated_residual(x1, mod.gate_mlp, dit_mlp_half(block, h2, !exec.gelu_recompute), block.mlp.fc2.bias);
}

at::Tensor dit_blocks_chained(const DiTBlockSeq& blocks, const std::vector<DiTModulation>& mods, const at::Tensor& x0,
                              at::ScalarType act, bool keep_activation, const CloseChain& close) {
  if (blocks.empty() || mods.size() != blocks.size())
    throw RuntimeError("dit_blocks_chained: " + std::to_string(blocks.size()) + " blocks and " +
                       std::to_string(mods.size()) + " modulations (one per block, at least one)");
  at::Tensor x = x0;
  at::Tensor h = ops::adaln_layernorm(x, mods[0].shift_msa, mods[0].scale_msa, act);
  for (size_t i = 0;; ++i) {
    PERFTRAIN_SCOPE_INDEXED("block", i);
    const DiTBlock& b = *blocks[i];
    auto [x1, h2] = dit_attention_half(b, x, h, mods[i], act);
    const GatedResidual mlp_residual{x1, mods[i].gate_mlp, dit_mlp_half(b, h2, keep_activation), b.mlp.fc2.bias};
    if (i + 1 == blocks.size()) return close(mlp_residual);
    std::tie(x, h) = add_with_norm(mlp_residual, mods[i + 1].shift_msa, mods[i + 1].scale_msa, act);
  }
}

}  // namespace perftrain::models::fused
