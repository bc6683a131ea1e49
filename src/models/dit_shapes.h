// The DiT architecture a state dict describes, read from its tensors' shapes
// under facebookresearch/DiT's names (what `perftrain convert` prints for a
// torch.save file): x_embedder.proj.weight [D, C, p, p] gives the width,
// input channels and patch; pos_embed [1, T, D] the image size; the blocks.N
// the depth; blocks.0.mlp.fc1.weight the MLP ratio; final_layer.linear.weight
// the output channels (2C: learned variance); the label table's rows the
// classes, with its last row the null class of classifier-free guidance, as
// every published DiT has it (class_dropout 0.1). Heads leave no trace in the
// shapes: they come from a hint, or from the registry model of that depth and
// width.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "models/dit_config.h"

namespace perftrain::models {

using TensorShapes = std::vector<std::pair<std::string, std::vector<int64_t>>>;

struct ShapeHints {
  std::string model;  // a registry name: the config's name, and its heads unless `heads` is set
  int64_t heads = 0;  // 0: the hint model's, else the registry model's of the same depth and width
};

// Throws UsageError naming `what` and the tensor that is missing or has a
// shape no DiT has, or saying to pass --heads when no registry model has the
// depth and width.
DiTConfig dit_config_from_shapes(const TensorShapes& shapes, const ShapeHints& hints, const std::string& what);

// One line: "DiT-XL/2: depth 28, hidden 1152, heads 16, patch 2, ...".
std::string describe_model_config(const DiTConfig& cfg);

}  // namespace perftrain::models
