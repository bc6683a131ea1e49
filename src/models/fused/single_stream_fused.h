// The single-stream DiT's fused schedule (DiTExecution::fused_kernels): the
// model's function through the fused ops, from its modules
// (SingleStreamDiT's public members) and the block pieces of
// models/fused/single_stream_block.h. All modulations in one product, the
// residual stream in fp32 whatever the compute dtype; without recompute every
// block and the final layer chained (fused::single_stream_blocks_chained, the
// last residual added with the final layer's norm); with recompute the blocks
// one by one (fused::single_stream_block under ops::recompute), then
// rms_adaln and linear for the final layer. docs/design.md, "A single-stream
// block, line by line", names each op.
#pragma once

#include <ATen/core/Tensor.h>

#include "models/single_stream.h"

namespace perftrain::models::fused {

// The patches [B, T, C*p*p], the condition tokens [B, Tc, D], the key mask
// [B, 1, 1, Tc + T] (undefined: none) and silu(t_embed(t)) [B, D] -> the
// final layer's image tokens [B, T, p*p*out] (the model unpatchifies). The
// compute dtype: autocast's, else the patches'.
at::Tensor single_stream_forward(const SingleStreamDiT& model, const at::Tensor& patches, const at::Tensor& ctok,
                                 const at::Tensor& mask, const at::Tensor& silu_c, const DiTExecution& exec);

}  // namespace perftrain::models::fused
