#include "train/speed.h"

#include "ops/attention_choice.h"
#include "ops/attention_head_bwd.h"
#include "ops/attention_head_fwd.h"
#include "ops/attention_tiled.h"
#include "ops/cublaslt_workspace.h"
#include "ops/weight_grad_stream.h"

namespace perftrain::train {

void apply_speed_settings(const SpeedConfig& speed) {
  validate_speed(speed);
  // Our whole-head backward needs our forward's saved state or cuDNN's:
  // with "tiled" our tiled kernels run wherever they apply (256 tokens too),
  // the whole-head backward after the tiled forward at 256 tokens; "auto"
  // keeps the whole-head kernels where they apply.
  ops::set_whole_head_attention_forward(speed.attention == "whole_head" || speed.attention == "auto");
  ops::set_whole_head_attention_backward(speed.attention != "cudnn");
  ops::set_tiled_attention(speed.attention == "tiled");
  // "auto": elsewhere, per shape, the fastest by timing of our tiled kernels both ways, cuDNN's both
  // ways, or cuDNN's forward with our tiled backward (ops/attention_choice).
  ops::set_attention_auto(speed.attention == "auto");
  ops::set_weight_grad_stream_mode(speed.weight_grad_stream == "on"    ? ops::WeightGradStreamMode::kOn
                                   : speed.weight_grad_stream == "off" ? ops::WeightGradStreamMode::kOff
                                                                       : ops::WeightGradStreamMode::kAuto);
  ops::set_gemm_tune_candidates(static_cast<int>(speed.gemm_tune));
}

models::DiTExecution dit_execution(const SpeedConfig& speed, bool cuda) {
  models::DiTExecution e;
  e.fused_kernels = cuda && speed.fused_kernels;
  e.recompute = speed.recompute;
  e.gelu_recompute = speed.gelu_recompute;
  return e;
}

}  // namespace perftrain::train
