// Delayed fp8 scaling state on tensors (issue 39): per scaled tensor (a
// "slot": a layer's input, weight, output gradient) the amax the step's casts
// accumulate, the amax history, the scale the casts multiply by and its
// inverse the fp8 products multiply by, and the overflow/underflow event
// counts; updated once a step on the device by kernels::fp8_scaling_update
// (its header states the rule), or on the CPU by the reference, which gives
// the same bits. The caller owns the state (a layer keeps one per fp8
// product's operands), so that a checkpoint saves named_tensors() and a
// resume continues bit for bit.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>
#include <utility>
#include <vector>

#include "kernels/fp8_scaling.h"
#include "ops/fp8_cast.h"

namespace perftrain::ops {

struct Fp8Scaling {
  std::vector<Fp8Format> formats;  // one per slot
  at::Tensor amax;                 // [S] fp32: this step's max |x| (zeroed by the update)
  at::Tensor history;              // [S, H] fp32: [s][0] the newest
  at::Tensor scale;                // [S] fp32: the casts' multiplier
  at::Tensor scale_inv;            // [S] fp32: 1 / scale, the products' multiplier (slots 16 bytes apart)
  at::Tensor events;               // [S, 2] fp32: overflow (non-finite amax), underflow (zero amax) counts

  int64_t slots() const { return int64_t(formats.size()); }
  int64_t history_len() const { return history.size(1); }
  // ("amax", amax), ("history", ...), ...: what a checkpoint keeps.
  std::vector<std::pair<std::string, at::Tensor>> named_tensors() const;
};

// A fresh state: amax, history and events zero, scale and scale_inv 1.
// history_len in [1, kernels::kFp8MaxHistory]; else UsageError.
Fp8Scaling make_fp8_scaling(std::vector<Fp8Format> formats, int64_t history_len, const at::Device& device);

// One step's update of every slot of `states` (all on one device): CUDA one
// launch per kernels::kFp8ScalingMaxSlots slots, CPU the reference. Between
// steps, never between a forward and its backward (the backward's products
// read the scale_inv the forward's casts used). margin: the power-of-two
// headroom (kernels/fp8_scaling.h).
void fp8_scaling_update(const std::vector<const Fp8Scaling*>& states, int margin);

// The rule on CPU tensors, slot by slot in plain fp32 arithmetic, in place.
void fp8_scaling_update_reference(const Fp8Scaling& state, int margin);

}  // namespace perftrain::ops
