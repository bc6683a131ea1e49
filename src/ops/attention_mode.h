// The [speed] key attention as one process-wide setting of ops: which
// attention kernels the packed forms (qkv_attention, projected_attention)
// run. One place for the mode's names and what each sets, for the trainer's
// config (train/speed) and for Python (perftrain.ops.set_attention_mode).
//   "whole_head"  our whole-head kernels where they apply (bf16, sm_90, 256
//                 tokens, no key mask, head dim 64 or 72); cuDNN's elsewhere.
//                 The library's own default (ops' switches as built).
//   "tiled"       our tiled kernels wherever they apply (ops/attention_tiled),
//                 256 tokens too; cuDNN's elsewhere.
//   "cudnn"       cuDNN's fused kernels both ways, everywhere.
//   "auto"        the whole-head kernels where they apply; elsewhere, per
//                 shape, the fastest plan by timing (ops/attention_choice).
//                 The trainer's default.
#pragma once

#include <string>
#include <vector>

namespace perftrain::ops {

// The names above, in that order.
const std::vector<std::string>& attention_modes();

// Sets the switches of ops/attention_head_fwd, _bwd, attention_tiled and
// attention_choice for `mode`; before the step is captured (a captured graph
// keeps the kernels it recorded). std::invalid_argument naming the modes for
// any other name.
void set_attention_mode(const std::string& mode);

// The mode the switches now make, or "custom" where they were set one by one
// to a combination no mode makes.
std::string attention_mode();

}  // namespace perftrain::ops
