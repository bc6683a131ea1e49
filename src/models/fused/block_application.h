// One application of a block in a fused schedule: the block (its heads, and
// a single-stream block's norms), the weights its linears run with
// (models/block_weights.h: the block's own, or a looped model's per-loop
// merged weights), and a tensor added to the residual stream as it starts (a
// looped model's reinjected prelude output; undefined: none), and the
// profiler range it runs in (base/scope.h): "<scope> <scope_index>" (a looped
// model's "loop 3"), or without a scope "block i" by its place in the
// sequence. A schedule runs a sequence of them, where the same block may come
// again. key: the application's name for its fp8 states (models/fp8_states.h):
// "blocks.3" for a block with its own weights, "shared.0.loop.2" for a looped
// model's shared block 0 in loop 2.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "models/block_weights.h"

namespace perftrain::models::fused {

template <class Block, class Weights>
struct BlockApplication {
  const Block* block;
  Weights weights;
  at::Tensor enter_add;
  const char* scope = nullptr;
  int64_t scope_index = 0;
  std::string key;
};

// The range name and index of application `a` at place i of its sequence.
template <class Application>
std::pair<const char*, int64_t> scope_of(const Application& a, size_t i) {
  if (a.scope != nullptr) return {a.scope, a.scope_index};
  return {"block", static_cast<int64_t>(i)};
}

// Each block with its own weights (weights_of), in order, keyed
// "<prefix>.<i>" by its place i.
template <class Block>
auto own_weights(const std::vector<const Block*>& blocks, const std::string& prefix = "blocks") {
  std::vector<BlockApplication<Block, decltype(weights_of(*blocks[0]))>> seq;
  for (size_t i = 0; i < blocks.size(); ++i)
    seq.push_back({blocks[i], weights_of(*blocks[i]), at::Tensor(), nullptr, 0, prefix + "." + std::to_string(i)});
  return seq;
}

}  // namespace perftrain::models::fused
