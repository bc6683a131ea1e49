#include "models/fused/dit_block.h"

#include <ATen/TensorOperators.h>
#include <ATen/ops/gelu.h>
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
#include "ops/qkv_attention.h"
#include "ops/residual_adaln.h"
#include "ops/stacked_linear.h"

namespace perftrain::models::fused {

std::vector<DiTModulation> split_dit_modulations(const at::Tensor& product, size_t count) {
  const std::vector<at::Tensor> c = product.chunk(int64_t(6 * count), -1);
  std::vector<DiTModulation> mods;
  for (size_t i = 0; i < count; ++i)
    mods.push_back({c[6 * i], c[6 * i + 1], c[6 * i + 2], c[6 * i + 3], c[6 * i + 4], c[6 * i + 5]});
  return mods;
}

DiTModulation dit_modulation(const DiTBlockWeights& w, const at::Tensor& silu_c) {
  return split_dit_modulations(ops::linear(silu_c, w.ada_w, w.ada_b), 1)[0];
}

std::vector<DiTModulation> dit_modulations(const DiTBlockSeq& seq, const at::Tensor& silu_c) {
  if (seq.empty()) return {};  // a looped model without prelude and coda
  std::vector<at::Tensor> weights, biases;
  for (const DiTApplication& a : seq) {
    weights.push_back(a.weights.ada_w);
    biases.push_back(a.weights.ada_b);
  }
  return split_dit_modulations(ops::stacked_linear(silu_c, weights, biases), seq.size());
}

std::pair<at::Tensor, at::Tensor> add_with_norm(const GatedResidual& r, const at::Tensor& shift,
                                                const at::Tensor& scale, at::ScalarType act) {
  return ops::residual_adaln(r.x, r.gate, r.y, shift, scale, act, 1e-6, r.bias);
}

ops::Fp8Operand open_linear_norm(const at::Tensor& x, const at::Tensor& shift, const at::Tensor& scale,
                                 at::ScalarType act, const Fp8Block& f, const char* layer, const at::Tensor& weight) {
  if (const auto target = block_linear_target(f, layer, x, weight.size(0)))
    return ops::adaln_layernorm_fp8(x, shift, scale, act, *target);
  return {ops::adaln_layernorm(x, shift, scale, act), at::Tensor()};
}

std::pair<at::Tensor, ops::Fp8Operand> add_with_linear_norm(const GatedResidual& r, const at::Tensor& shift,
                                                            const at::Tensor& scale, at::ScalarType act,
                                                            const Fp8Block& f, const char* layer,
                                                            const at::Tensor& weight) {
  if (const auto target = block_linear_target(f, layer, r.x, weight.size(0)))
    return ops::residual_adaln_fp8(r.x, r.gate, r.y, shift, scale, act, *target, 1e-6, r.bias);
  auto [x1, h] = add_with_norm(r, shift, scale, act);
  return {std::move(x1), ops::Fp8Operand{std::move(h), at::Tensor()}};
}

std::pair<at::Tensor, ops::Fp8Operand> dit_attention_half(const DiTBlock& block, const DiTBlockWeights& w,
                                                          const at::Tensor& x, const ops::Fp8Operand& h,
                                                          const DiTModulation& mod, at::ScalarType act,
                                                          const Fp8Block& fp8) {
  const at::Tensor a = fp8.states != nullptr
                           ? ops::qkv_attention(block_linear(fp8, "attn.qkv", h, w.qkv_w, w.qkv_b), block.attn.heads())
                           : ops::projected_attention(h.x, w.qkv_w, w.qkv_b, block.attn.heads());  // [B, T, D] act
  return add_with_linear_norm({x, mod.gate_msa, block_linear(fp8, "attn.proj", a, w.proj_w), w.proj_b}, mod.shift_mlp,
                              mod.scale_mlp, act, fp8, "mlp.fc1", w.fc1_w);
}

at::Tensor dit_mlp_half(const DiTBlockWeights& w, const ops::Fp8Operand& h2, bool keep_activation,
                        const Fp8Block& fp8) {
  if (fp8.states == nullptr) return ops::gelu_mlp(h2.x, w.fc1_w, w.fc1_b, w.fc2_w, at::Tensor(), keep_activation);
  // The bf16 fc1 + bias + GELU epilogue takes no fp8 operands: fc1 with
  // GELU in the casts on either side, writing fc2's codes from pre and
  // fc1's dY codes from d(act) (ops/fp8_linear_gelu.h), else GELU on its own.
  if (const auto act = block_linear_gelu(fp8, "mlp.fc1", h2, w.fc1_w, w.fc1_b, "mlp.fc2", w.fc2_w.size(0)))
    return block_linear(fp8, "mlp.fc2", *act, w.fc2_w);  // [B, T, D]
  const at::Tensor pre = block_linear(fp8, "mlp.fc1", h2, w.fc1_w, w.fc1_b);
  return block_linear(fp8, "mlp.fc2", at::gelu(pre, "tanh"), w.fc2_w);
}

at::Tensor dit_block(const DiTBlock& block, const DiTBlockWeights& w, const at::Tensor& x, const at::Tensor& c,
                     const DiTExecution& exec) {
  const at::ScalarType act = compat::autocast_dtype(x.device().type()).value_or(x.scalar_type());
  const DiTModulation mod = dit_modulation(w, at::silu(c).to(act));
  auto [x1, h2] =
      dit_attention_half(block, w, x, {ops::adaln_layernorm(x, mod.shift_msa, mod.scale_msa, act), at::Tensor()}, mod, act);
  return ops::gated_residual(x1, mod.gate_mlp, dit_mlp_half(w, h2, !exec.gelu_recompute), w.fc2_b);
}

at::Tensor dit_blocks_chained(const DiTBlockSeq& seq, const std::vector<DiTModulation>& mods, const at::Tensor& x0,
                              at::ScalarType act, bool keep_activation, const CloseChain& close,
                              Fp8States* fp8) {
  if (seq.empty() || mods.size() != seq.size())
    throw RuntimeError("dit_blocks_chained: " + std::to_string(seq.size()) + " blocks and " +
                       std::to_string(mods.size()) + " modulations (one per block, at least one)");
  at::Tensor x = seq[0].enter_add.defined() ? x0 + seq[0].enter_add : x0;
  ops::Fp8Operand h =
      open_linear_norm(x, mods[0].shift_msa, mods[0].scale_msa, act, {fp8, seq[0].key}, "attn.qkv", seq[0].weights.qkv_w);
  for (size_t i = 0;; ++i) {
    const auto [scope, index] = scope_of(seq[i], i);
    PERFTRAIN_SCOPE_INDEXED(scope, index);
    const DiTBlockWeights& w = seq[i].weights;
    const Fp8Block f{fp8, seq[i].key};
    auto [x1, h2] = dit_attention_half(*seq[i].block, w, x, h, mods[i], act, f);
    GatedResidual mlp_residual{x1, mods[i].gate_mlp, dit_mlp_half(w, h2, keep_activation, f), w.fc2_b};
    if (i + 1 == seq.size()) return close(mlp_residual);
    if (seq[i + 1].enter_add.defined()) mlp_residual.x = x1 + seq[i + 1].enter_add;
    std::tie(x, h) = add_with_linear_norm(mlp_residual, mods[i + 1].shift_msa, mods[i + 1].scale_msa, act,
                                          {fp8, seq[i + 1].key}, "attn.qkv", seq[i + 1].weights.qkv_w);
  }
}

}  // namespace perftrain::models::fused
