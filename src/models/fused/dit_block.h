// A DiT block's fused schedule, in pieces: the same function as
// DiTBlock::forward through the ops of src/ops (adaLN LayerNorm, the qkv
// projection with attention, cuBLASLt products with bias and GELU epilogues,
// gated residuals fused with the norm that follows them; docs/design.md, "A
// DiT block, line by line"). Each piece takes the block (its heads) and the
// weights it runs with (models/block_weights.h: weights_of(block), or a looped
// model's per-loop merged weights) and nothing of the model around it, so a
// schedule may run one block many times with other weights each time (a
// looped family lists the same block again in a DiTBlockSeq).
// Nothing here fires a module's hooks (DiTBlock::forward does, around
// dit_block). The residual stream is fp32; matrix operands are in the compute
// dtype `act`.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <utility>
#include <vector>

#include "models/block_weights.h"
#include "models/dit.h"
#include "models/fp8_states.h"
#include "models/fused/block_application.h"

namespace perftrain::models::fused {

// A block's six adaLN modulation vectors [B, D] (the reference's chunk(6)).
struct DiTModulation {
  at::Tensor shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp;
};

// A gated residual not yet added: x + gate * (y + bias), bias undefined for
// none. A half-block ends in one; it is added alone (ops::gated_residual) or
// together with the modulated norm that opens the next half-block
// (add_with_norm).
struct GatedResidual {
  at::Tensor x, gate, y, bias;
};

// The applications in the order a schedule runs them (block_application.h;
// own_weights(blocks) for blocks with their own weights).
using DiTApplication = BlockApplication<DiTBlock, DiTBlockWeights>;
using DiTBlockSeq = std::vector<DiTApplication>;

// One block's modulation from silu(c) in the compute dtype: the modulation
// Linear of w through ops::linear (the optimizer's bf16 weight copy when w
// is a block's own, the bias in the product's epilogue).
DiTModulation dit_modulation(const DiTBlockWeights& w, const at::Tensor& silu_c);

// Every application's modulation from silu(c) in one product
// (ops::stacked_linear: the weights read in place where their bf16 copies
// lie back to back, as blocks' own weights do; else concatenated), split
// once; backward joins their gradients in one cat. None for an empty seq.
std::vector<DiTModulation> dit_modulations(const DiTBlockSeq& seq, const at::Tensor& silu_c);

// The count modulations side by side in product [..., 6 * count * D], in order.
std::vector<DiTModulation> split_dit_modulations(const at::Tensor& product, size_t count);

// r's residual and the modulated LayerNorm of its result in one pass
// (ops::residual_adaln): -> (x + gate * (y + bias), modulate(norm(that),
// shift, scale) in act). The bias is added there, and its gradient comes from
// that kernel's column sums rather than a reduction over y's gradient.
std::pair<at::Tensor, at::Tensor> add_with_norm(const GatedResidual& r, const at::Tensor& shift,
                                                const at::Tensor& scale, at::ScalarType act);

// A linear's opening norms with h handed to it: where block_linear runs
// `layer` (weight: its weight) of application f in fp8 with fused casts
// (block_linear_target), the norm writes h's E4M3 codes in place of h
// (ops::adaln_layernorm_fp8, ops::residual_adaln_fp8); else h itself.
ops::Fp8Operand open_linear_norm(const at::Tensor& x, const at::Tensor& shift, const at::Tensor& scale,
                                 at::ScalarType act, const Fp8Block& f, const char* layer, const at::Tensor& weight);
std::pair<at::Tensor, ops::Fp8Operand> add_with_linear_norm(const GatedResidual& r, const at::Tensor& shift,
                                                            const at::Tensor& scale, at::ScalarType act,
                                                            const Fp8Block& f, const char* layer,
                                                            const at::Tensor& weight);

// The attention half from the residual stream x and its modulated norm h:
// projected_attention, proj without its bias, and the residual added with
// the MLP's modulated norm -> (x1, h2). With fp8 states (fp8.states): the
// qkv product through block_linear ("attn.qkv"; h may be its codes, from
// open_linear_norm), then qkv_attention on the packed result, proj's
// ("attn.proj"), and h2 for "mlp.fc1" from add_with_linear_norm.
std::pair<at::Tensor, ops::Fp8Operand> dit_attention_half(const DiTBlock& block, const DiTBlockWeights& w,
                                                          const at::Tensor& x, const ops::Fp8Operand& h,
                                                          const DiTModulation& mod, at::ScalarType act,
                                                          const Fp8Block& fp8 = {});

// The MLP of h2 without fc2's bias (the residual after it adds it):
// gelu_mlp; keep_activation false: GELU again in backward. With fp8 states:
// fc1 ("mlp.fc1", its bias in the product), GELU (tanh) as its own op, fc2
// ("mlp.fc2"): gelu_mlp's bias + GELU epilogue takes no fp8 operands, and
// keep_activation does not apply (fc2 keeps its fp8 input).
at::Tensor dit_mlp_half(const DiTBlockWeights& w, const ops::Fp8Operand& h2, bool keep_activation,
                        const Fp8Block& fp8 = {});

// The whole block on its own with the weights w (x [B, T, D] fp32, c [B, D]
// -> [B, T, D]): its modulation, adaln_layernorm to open it, the two halves, the MLP
// residual added alone (ops::gated_residual). act: autocast's dtype, else
// x's; exec.gelu_recompute as dit_mlp_half's keep_activation false.
at::Tensor dit_block(const DiTBlock& block, const DiTBlockWeights& w, const at::Tensor& x, const at::Tensor& c,
                     const DiTExecution& exec);

// What closes a chain: receives the last block's MLP residual, not added.
using CloseChain = std::function<at::Tensor(const GatedResidual&)>;

// Applications chained (non-empty; mods[i] is seq[i]'s): the first opened with
// adaln_layernorm, each block's MLP residual added together with the next
// block's first modulated norm (add_with_norm; an application's enter_add
// joins the residual there, or is added to x0 for the first), so the residual stream is
// written once per half-block and its two gradients meet inside one kernel.
// The last block's residual goes to `close` (e.g. added with the final
// layer's norm), called while the last block's tensors are still held, as
// one loop would hold them; returns what close returns. Each application
// runs in a "block i" profiler range (base/scope.h), i its place in seq.
// fp8: the table whose states (by each application's key) the block
// linears run with (models/fp8_states.h); null: none.
at::Tensor dit_blocks_chained(const DiTBlockSeq& seq, const std::vector<DiTModulation>& mods, const at::Tensor& x0,
                              at::ScalarType act, bool keep_activation, const CloseChain& close,
                              Fp8States* fp8 = nullptr);

}  // namespace perftrain::models::fused
