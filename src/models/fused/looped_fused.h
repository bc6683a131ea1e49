// The looped DiT's fused schedule (DiTExecution::fused_kernels; models/looped.h
// for the model and its plain forward): the same function through the block
// pieces of models/fused/dit_block.h or single_stream_block.h, the shared
// blocks applied once per loop with that loop's weights (LoopedDiT::loop_weights:
// the shared W merged with the loop's adapter, cast to the compute dtype by
// the ops per call; a block's own weights, read from the optimizer's bf16
// copies, without adapters).
//   - Modulations: the prelude's and coda's from silu(c) in one product, as
//     the DiT schedule's; every loop's from silu(c + loop_embed[l]) stacked
//     [L, B, D] in one more: one stacked_linear when the loops share the
//     modulation weights (no adaln adapter), else one batched product over
//     the loops' merged weights.
//   - Without recompute the applications run CHAINED (dit_blocks_chained:
//     each residual added together with the next application's first norm)
//     from the first block to the final layer, across loops; reinject add
//     joins the chain (e added as a loop starts); the chain closes (the
//     residual added alone) only where the stream itself is needed: after
//     the prelude when e is reinjected, before a reinject concat, and around
//     a routed loop.
//   - A routed loop: the router's top-k on the device (LoopedDiT::route), the
//     kept tokens gathered [B, k, D], the group chained on them, the gated
//     change scattered back (ATen gather and scatter_add); static shapes, no
//     host sync, so the step captures into one CUDA graph. Single-stream
//     routed loops run the plain block (the gathered tokens' rotary tables
//     differ per sample; ops::qk_norm_rope takes one table).
//   - With recompute every application alone under ops::recompute, the loop's
//     weights merged inside it (backward merges again).
// docs/design.md, "The looped schedule".
#pragma once

#include <ATen/core/Tensor.h>

#include "models/looped.h"

namespace perftrain::models::fused {

// x [B, C, H, W], t [B], cond -> the prediction [B, out, H, W] and the
// routers' auxiliary loss (weighted; undefined without routing), as
// LoopedDiT::forward_train computes them. The compute dtype: autocast's, else x's.
ForwardOutput looped_forward(const LoopedDiT& model, const at::Tensor& x, const at::Tensor& t, const Condition& cond,
                             const DiTExecution& exec);

}  // namespace perftrain::models::fused
