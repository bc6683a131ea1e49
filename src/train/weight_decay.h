// Parameter groups for weight decay, as PyTorch users configure AdamW for a
// transformer: train.weight_decay applies to the matrix weights (linear and
// convolution kernels) only, never to
//   - biases and norm scales (fewer than two dimensions, or "norm" in a name part),
//   - embedding tables: positional, label, time (a name part "pos_embed",
//     ending in "_embed", or holding "embedding": y_embedder.embedding_table),
//   - the adaLN modulation layers ("adaLN" in a name part: zero-initialised,
//     they open each block's gates; decay would pull them back to closed).
// The patch embedding's convolution and the timestep MLP's linears are
// matrices and decay. train.decay_all = true decays every parameter (the
// behaviour of a plain torch.optim.AdamW over model.parameters()).
#pragma once

#include <ATen/core/Tensor.h>

#include <string>
#include <utility>
#include <vector>

namespace perftrain::train {

// Whether train.weight_decay applies to the parameter `name` (its full
// state_dict name, "blocks.0.attn.qkv.weight") of this shape.
bool decays(const std::string& name, const at::Tensor& param);

// Per parameter, in order: decay_all or decays(name, param).
std::vector<bool> decay_flags(const std::vector<std::pair<std::string, at::Tensor>>& named_params, bool decay_all);

}  // namespace perftrain::train
