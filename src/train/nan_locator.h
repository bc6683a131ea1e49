// Where a NaN/Inf came from: runs one forward and backward eagerly with a
// check after every module's forward and on every gradient (the nn::Module
// hook point, plus a hook on each parameter's gradient) and names the first
// module whose output went non-finite while its inputs were finite: in the
// forward, the module itself (hooks fire innermost first, so the deepest one
// that made it); in backward, the module whose input gradients went
// non-finite while the gradients of its outputs were finite, or the one whose
// parameter's gradient did. The step runner calls it on the batch of a
// non-finite step (health.nan_policy); slow (host syncs on every check).
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <string>
#include <vector>

#include "nn/module.h"

namespace perftrain::train {

struct TensorSummary {
  std::vector<int64_t> shape;
  int64_t numel = 0, nan = 0, inf = 0;
  double min = 0, max = 0, mean_abs = 0;  // over the finite elements
  // "[8, 16, 32] 3 NaN 0 Inf, finite in [-1.2, 3.4], mean |x| 0.5"
  std::string text() const;
};
TensorSummary summarize_tensor(const at::Tensor& t);

struct NonFiniteSite {
  bool found = false;
  std::string phase;   // weights | forward | loss | backward ("" when nothing was non-finite)
  std::string module;  // "blocks.3.mlp.fc1" (a parameter's name for weights; "" for the model itself)
  std::string type;    // the module's class ("Linear")
  std::string detail;  // what was non-finite, one line
  // Which of the module's calls in the forward (0-based; -1: a module called
  // once, or a parameter) and how many there were; for a looped model's
  // shared block the call is the loop (loop >= 0), for its per-loop
  // parameters (adapters.<l>.*, routers.<l>.*, a row of loop_embed) too.
  int64_t call = -1, calls = 0, loop = -1;
  std::vector<TensorSummary> inputs, outputs;  // forward: its inputs/outputs; backward: gradients of outputs/inputs
  // One paragraph for the log and the report.
  std::string message() const;
};

// model: the module tree the loss runs through; loss_fn: runs the forward
// A module called several times in the forward (a looped model's shared
// blocks, once per loop) is named with the call: in the forward by counting
// its calls, in backward by counting the gradients of its outputs, which
// autograd computes in the reverse order of the calls.
// and returns the loss (a scalar with a graph back to model's parameters).
// anomaly_mode: libtorch's autograd anomaly mode over the backward (its
// error, when it throws, goes into detail). Leaves no hook behind and no
// gradient on the parameters.
NonFiniteSite locate_nonfinite(const nn::Module& model, const std::function<at::Tensor()>& loss_fn,
                               bool anomaly_mode = false);

// The name of the first tensor of `module`'s state holding a NaN/Inf, or ""
// (one host sync per tensor): a checkpoint is never written from such weights.
std::string first_nonfinite_tensor(const nn::Module& module);

}  // namespace perftrain::train
