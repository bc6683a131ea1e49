// What the step-runner GPU tests (train's step_runner_gpu_test.cpp, dist's
// dp_capture_gpu_test.cpp) share: a few steps of a StepRunner and what they
// leave behind, to compare two ways of running the same steps.
#pragma once

#include <string>
#include <vector>

#include "data/batch_loader.h"
#include "nn/module.h"
#include "train/step_runner.h"

namespace perftrain::testing {

// The loss of each step, the model's then the EMA's weights after the last,
// and how the steps ran.
struct Trained {
  std::vector<double> losses;
  std::vector<at::Tensor> weights;
  bool graph_active = false, weight_grad_stream = false;
  std::string graph_status, data_parallel_note;
};

// One step of r per batch of `data`, each followed by its loss read-back.
inline Trained run_steps(train::StepRunner& r, const std::vector<data::Batch>& data, const nn::Module& model,
                         const nn::Module& ema) {
  Trained t;
  for (const auto& b : data) {
    r.step(b);
    t.losses.push_back(r.take_window().loss);
  }
  t.graph_active = r.graph_active();
  t.graph_status = r.graph_status();
  t.data_parallel_note = r.data_parallel_note();
  t.weight_grad_stream = r.weight_grad_stream();
  for (auto& p : model.parameters()) t.weights.push_back(p.detach().clone());
  for (auto& p : ema.parameters()) t.weights.push_back(p.detach().clone());
  return t;
}

}  // namespace perftrain::testing
