// The [speed] config applied: the process-wide choices set in ops before a
// run or a bench builds its first step, and the DiT execution plan the step
// runner passes to the model's forward.
#pragma once

#include "models/dit.h"
#include "train/config.h"

namespace perftrain::train {

// Sets what ops reads process-wide from `speed` (validated, TrainConfig::
// validate): our attention kernels or cuDNN's (forward and backward,
// ops::set_whole_head_attention_forward / _backward, ops::set_tiled_attention),
// the weight-gradient stream
// rule (ops::set_weight_grad_stream_mode) and the GEMM tuning count
// (ops::set_gemm_tune_candidates). Call it before the first step is built
// or captured; UsageError for a value validate() would refuse.
void apply_speed_settings(const SpeedConfig& speed);

// How the model's blocks run for `speed` on a CUDA device or not: the fused
// ops only on CUDA (on the CPU they would only run their references, and the
// plain path is the same function); recompute and gelu_recompute as set.
models::DiTExecution dit_execution(const SpeedConfig& speed, bool cuda);

}  // namespace perftrain::train
