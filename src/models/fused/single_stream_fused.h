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

#include "models/fused/single_stream_block.h"
#include "models/single_stream.h"

namespace perftrain::models::fused {

// The patches [B, T, C*p*p], the condition tokens [B, Tc, D], the key mask
// [B, 1, 1, Tc + T] (undefined: none) and silu(t_embed(t)) [B, D] -> the
// final layer's image tokens [B, T, p*p*out] (the model unpatchifies). The
// compute dtype: autocast's, else the patches'.
at::Tensor single_stream_forward(const SingleStreamDiT& model, const at::Tensor& patches, const at::Tensor& ctok,
                                 const at::Tensor& mask, const at::Tensor& silu_c, const DiTExecution& exec);

// The pieces of it a looped model of single-stream blocks shares:
// The residual stream's first value, fp32 [B, Tc + T, D]: the condition
// tokens, then the patches' product with the embedder's weight in act.
at::Tensor single_stream_tokens(const nn::Linear& x_embedder, const at::Tensor& patches, const at::Tensor& ctok,
                                at::ScalarType act);
// The rotary tables, the key mask (undefined: none) and its attention bias, made once.
SingleStreamContext single_stream_context(const at::Tensor& cos, const at::Tensor& sin, const at::Tensor& mask,
                                          at::ScalarType act, bool keep_activation);
// The final layer's scale [B, D] from silu(c) in the compute dtype.
at::Tensor single_stream_final_scale(const SingleStreamFinalLayer& layer, const at::Tensor& silu_c);
// The final layer closing a chain: the last residual added with the final
// norm (no weight) and its scale, then the product -> [B, S, p*p*out] (all tokens).
at::Tensor single_stream_final_layer_after(const SingleStreamFinalLayer& layer, const PostNormResidual& last,
                                           const at::Tensor& final_scale, at::ScalarType act);
// The final layer alone on x [B, S, D] (after blocks one by one) -> [B, S, p*p*out].
at::Tensor single_stream_final_layer(const SingleStreamFinalLayer& layer, const at::Tensor& x,
                                     const at::Tensor& silu_c, at::ScalarType act);

}  // namespace perftrain::models::fused
