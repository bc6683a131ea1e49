// One application of a block in a fused schedule: the block (its heads, and
// a single-stream block's norms), the weights its linears run with
// (models/block_weights.h: the block's own, or a looped model's per-loop
// merged weights), and a tensor added to the residual stream as it starts (a
// looped model's reinjected prelude output; undefined: none). A schedule runs
// a sequence of them, where the same block may come again.
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

#include "models/block_weights.h"

namespace perftrain::models::fused {

template <class Block, class Weights>
struct BlockApplication {
  const Block* block;
  Weights weights;
  at::Tensor enter_add;
};

// Each block with its own weights (weights_of), in order.
template <class Block>
auto own_weights(const std::vector<const Block*>& blocks) {
  std::vector<BlockApplication<Block, decltype(weights_of(*blocks[0]))>> seq;
  for (const Block* b : blocks) seq.push_back({b, weights_of(*b), at::Tensor()});
  return seq;
}

}  // namespace perftrain::models::fused
