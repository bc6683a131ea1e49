// Activation recompute (gradient checkpointing) for one block: the forward
// runs without keeping its intermediates; backward runs the block's forward
// again with grad enabled, under the autocast state and the weight copies
// (ops/compute_weights.h) the forward had, and back-propagates through it. Costs one more forward of the block per step and
// saves all of its activations but the input: for DiT, ~10x less activation
// memory per block.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>

namespace perftrain::ops {

// fn(x, c) -> y must be deterministic (no dropout): it is called twice.
using BlockFn = std::function<at::Tensor(const at::Tensor& x, const at::Tensor& c)>;
at::Tensor recompute(const BlockFn& fn, const at::Tensor& x, const at::Tensor& c);

}  // namespace perftrain::ops
