// AdamW over a model's parameters: moments and step counters live on the
// parameters' device and one fused ATen kernel per parameter group updates
// its tensors, so a step costs a few launches, not one per parameter. State is named after the
// parameters ("exp_avg.blocks.0.attn.qkv.weight") for checkpoints. Two
// parameter groups: with weight decay and without (AdamWOptions::decay_all).
#pragma once

#include <ATen/core/Tensor.h>

#include <string>
#include <utility>
#include <vector>

namespace perftrain::train {

struct AdamWOptions {
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.0;
  // weight_decay on every parameter, or only on those train::decays() names
  // (train/weight_decay.h: train.decay_all = false).
  bool decay_all = true;
};

class AdamW {
 public:
  AdamW(std::vector<std::pair<std::string, at::Tensor>> named_params, AdamWOptions opts);
  // Applies one update with learning rate lr to every parameter with a
  // gradient, then leaves the gradients undefined (set_to_none).
  void step(double lr);
  int64_t steps_taken() const { return steps_taken_; }

  std::vector<std::pair<std::string, at::Tensor>> state() const;
  // Restores from state(); throws RuntimeError naming a missing or mis-shaped tensor.
  void load_state(const std::vector<std::pair<std::string, at::Tensor>>& state);

 private:
  std::vector<std::pair<std::string, at::Tensor>> params_;
  std::vector<at::Tensor> exp_avg_, exp_avg_sq_, steps_;
  std::vector<bool> decay_;  // per parameter: its group takes weight decay
  AdamWOptions opts_;
  int64_t steps_taken_ = 0;
};

}  // namespace perftrain::train
