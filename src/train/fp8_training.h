// train.precision = fp8 (issue 39) as the step runner runs it: the scaling
// states' table (models/fp8_states.h) made and handed to the model, its
// constants, its line for the log and report, and its part of a checkpoint's
// trainer state ("fp8.<layer>.<tensor>", "fp8.history_len").
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "distributed/group.h"
#include "models/diffusion_model.h"
#include "models/fp8_states.h"
#include "observe/grad_health.h"
#include "train/config.h"

namespace perftrain::train {

constexpr const char* kFp8Prefix = "fp8.";

// The table for an fp8 run of `model` (train.fp8_amax_history,
// train.fp8_margin), pointed to by exec (whose
// fused_kernels it turns on: on the CPU the fused schedule runs on the ops'
// references). UsageError naming train.precision for a model without a fused
// schedule or with speed.recompute.
std::unique_ptr<models::Fp8States> fp8_states_for(const models::DiffusionModel& model, const TrainConfig& cfg,
                                                  models::DiTExecution& exec);

// Data parallel: every rank's amax replaced by the maximum over the ranks
// (a non-finite one as +inf, so that every rank counts the overflow), so that
// the ranks' next scales agree. On the stream, no host wait: capturable. Every
// rank calls it at the same point of its step. One collective on the table's
// one buffer once frozen; the first step, whose forward makes the states (so
// none can be re-homed before its update), reduces each state's amax on its
// own: that step always runs eagerly, so the extra collectives are never
// captured, and no state has to exist before the model asks for it.
void reduce_fp8_amax(const models::Fp8States& states, distributed::Group& group);

// After the first (eager) step made every state: no more are made (a capture
// must not allocate), and a checkpoint's state no layer asked for is a
// UsageError naming it.
void fp8_states_made(models::Fp8States& states);

// "fp8 products in 24 linears (delayed scaling, amax history 16, margin 0); 2 ran bf16
// (shapes not multiples of 16): blocks.0.attn.qkv, ..."
std::string describe_fp8(const models::Fp8States& states);

// Every state's scales and event counts as they stand (one copy to the host).
std::vector<observe::Fp8LayerHealth> fp8_health(const models::Fp8States& states);

// A checkpoint's trainer state split into the fp8 tensors (prefix removed)
// and the rest. fp8_run: whether this run is fp8; a state with fp8 tensors
// for a run without, or the reverse, is a UsageError naming train.precision.
struct Fp8Split {
  std::vector<std::pair<std::string, at::Tensor>> rest, fp8;
};
Fp8Split split_fp8_state(const std::vector<std::pair<std::string, at::Tensor>>& all, bool fp8_run);

}  // namespace perftrain::train
