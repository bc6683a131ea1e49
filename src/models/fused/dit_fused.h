// DiT's fused schedule (DiTExecution::fused_kernels): the model's function
// through the fused ops, from its modules (DiT's public members) and the
// block pieces of models/fused/dit_block.h. The patch embedding as one
// product with the position add fused; without recompute every block and the
// final layer chained (fused::dit_blocks_chained, the last residual added
// with the final layer's norm); with recompute the blocks one by one as
// DiT::run_blocks runs them (each DiTBlock::forward dispatching to
// fused::dit_block under ops::recompute), then dit_final_layer.
// docs/design.md, "A DiT block, line by line", names each op and kernel.
#pragma once

#include <ATen/core/Tensor.h>

#include "models/dit.h"
#include "models/fused/dit_block.h"

namespace perftrain::models::fused {

// The image x [B, C, H, W] and the condition c = t_embed(t) + y_embed(y)
// [B, D] -> the final layer's tokens [B, T, p*p*out] (DiT::forward
// unpatchifies). The compute dtype: autocast's, else x's.
at::Tensor dit_forward(const DiT& model, const at::Tensor& x, const at::Tensor& c, const DiTExecution& exec);

// The final layer alone (after blocks run one by one): x [B, T, D], c [B, D]
// -> [B, T, p*p*out] through adaln_layernorm and linear. The compute dtype:
// autocast's, else x's.
at::Tensor dit_final_layer(const FinalLayer& layer, const at::Tensor& x, const at::Tensor& c);

// The final layer closing a chain (fused::dit_blocks_chained's close): the
// last block's residual added together with the final layer's modulated norm
// (its shift and scale from silu(c) in act), then its product -> [B, T,
// p*p*out]; the residual stream itself is not kept.
at::Tensor dit_final_layer_after(const FinalLayer& layer, const GatedResidual& last, const at::Tensor& silu_c,
                                 at::ScalarType act);

}  // namespace perftrain::models::fused
