#include "train/speed.h"

#include "ops/attention_mode.h"
#include "ops/cublaslt_workspace.h"
#include "ops/weight_grad_stream.h"

namespace perftrain::train {

void apply_speed_settings(const SpeedConfig& speed) {
  validate_speed(speed);
  ops::set_attention_mode(speed.attention);  // the modes: ops/attention_mode.h
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
