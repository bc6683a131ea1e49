// The whole optimizer step on the device: gradient norm and clipping, the
// fp16 dynamic loss scale, the LR schedule, AdamW and the EMA in three
// multi-tensor launches (ops/multi_tensor_adamw.h), with no host sync and no
// allocation after construction, so a training step that ends in step()
// captures in one CUDA graph. The LR, norm and loss scale stay on the device
// as 0-d tensors, read when the trainer logs.
//
// It is AdamW + clip_grad_norm_ + ema_update_ + lr_at of this folder in one,
// with the same parameter groups for weight decay (train/weight_decay.h):
// the same numbers, and state() under AdamW::state()'s names (one step counter
// shared by all parameters, written under every "step.<name>") plus
// "loss_scale", so checkpoints move between the two.
//
// On a CPU device the same semantics run as plain ATen ops (host syncs allowed).
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "ops/compute_weights.h"
#include "ops/multi_tensor_adamw.h"

namespace perftrain::train {

// The update's hyper-parameters (ops::MultiTensorAdamWOptions) and where the
// fp16 loss scale starts.
struct DeviceOptimizerOptions : ops::MultiTensorAdamWOptions {
  double initial_loss_scale = 65536;  // fp16: multiply the loss by loss_scale() before backward
  // Keep a bf16 copy of every parameter, rewritten by the update kernel, for
  // the bf16 matrix products to read (compute_weights()) instead of casting
  // each weight on every call. The copies live in one buffer, those of one
  // shape one after another in parameter order, so that an op reading many
  // layers of one shape at once (ops::stacked_linear: DiT's adaLN
  // modulations) reads them as one matrix without a copy.
  bool bf16_shadows = false;
  // Weight decay on every parameter (true: torch.optim.AdamW over all of
  // them), or on those train::decays() names only (train.decay_all = false).
  bool decay_all = true;
};

class DeviceOptimizer {
 public:
  // named_params: float32, contiguous, one device; ema_params: the EMA model's
  // parameters in the same order and shapes (empty: no EMA).
  // owned (ZeRO-1, train/sharded_optimizer.h; empty: all): the parameters
  // this optimizer updates and keeps moments for. The others' gradients
  // count in the norm only; after their owners' weights have arrived,
  // follow_others() brings their EMA and bf16 copies along.
  DeviceOptimizer(std::vector<std::pair<std::string, at::Tensor>> named_params, std::vector<at::Tensor> ema_params,
                  DeviceOptimizerOptions opts, std::vector<bool> owned = {});
  ~DeviceOptimizer();
  DeviceOptimizer(const DeviceOptimizer&) = delete;
  DeviceOptimizer& operator=(const DeviceOptimizer&) = delete;

  // One update from param.grad() (a parameter without a gradient stands
  // still, its EMA still follows it); then every gradient is set to undefined.
  // With dynamic_loss_scale a step whose gradients hold inf/NaN changes
  // nothing but the scale (halved) and skipped().
  void step();
  // ZeRO-1, after step() and after the parameters this optimizer does not
  // own were overwritten with their owners' updated values: their EMA takes
  // the same update (the lerp weight of the step, 0 for a skipped step) and
  // their bf16 copies are rewritten. No host sync (captures).
  void follow_others();

  const at::Tensor& loss_scale() const { return loss_scale_; }  // float32 0-d (1 without dynamic scaling)
  const at::Tensor& grad_norm() const { return grad_norm_; }    // unscaled, before clipping, of the last step
  const at::Tensor& lr() const { return lr_; }                  // the schedule's, of the last step
  const at::Tensor& skipped() const { return skipped_; }        // float32 0-d count of skipped steps
  const at::Tensor& steps_taken() const { return step_; }       // float32 0-d, AdamW's step counter
  const DeviceOptimizerOptions& options() const { return opts_; }
  // The LR schedule's position: steps taken before the next one, skipped
  // ones too (a resumed run: its global step). Starts at 0.
  void set_schedule_step(int64_t steps);

  // With bf16_shadows: each parameter and its bf16 copy, for an
  // ops::ComputeWeightsScope. The copies follow every step(); after the
  // parameters change by other means (a checkpoint loaded into the model),
  // refresh_shadows() first. Without: empty.
  ops::ComputeWeights compute_weights() const;
  void refresh_shadows();

  // "exp_avg.<name>", "exp_avg_sq.<name>", "step.<name>" for each parameter
  // (as AdamW::state()), then "loss_scale". Live tensors, not copies. With
  // `owned`: the owned parameters' only; load_state reads only those too.
  std::vector<std::pair<std::string, at::Tensor>> state() const;
  // Restores from state() or AdamW::state(): throws RuntimeError naming a
  // missing or mis-shaped tensor. "loss_scale" is optional (used only with
  // dynamic scaling); the step counter is taken from the first parameter.
  void load_state(const std::vector<std::pair<std::string, at::Tensor>>& state);

 private:
  std::vector<std::pair<std::string, at::Tensor>> params_;
  std::vector<bool> owned_;  // per parameter; exp_avg_/exp_avg_sq_ are undefined where false
  std::vector<at::Tensor> ema_, exp_avg_, exp_avg_sq_, shadows_;
  DeviceOptimizerOptions opts_;
  at::Tensor scalars_;  // ops::make_adamw_scalars; the members below are 0-d views of its slots
  at::Tensor loss_scale_, grad_norm_, lr_, skipped_, step_, good_steps_, schedule_step_;
  std::unique_ptr<ops::MultiTensorAdamW> op_;
};

}  // namespace perftrain::train
