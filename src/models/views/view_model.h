// The model that perftrain summary and graph look at: a DiT (either family)
// built from its
// config and moved to the meta device (shapes without storage), with a batch
// of meta inputs, so one forward of DiT-XL/2 at batch 256 runs in well under
// a second and allocates nothing. Drawing the initial weights on the CPU
// before the move is most of the time (seconds for DiT-XL/2).
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>

#include "models/diffusion_model.h"

namespace perftrain::models::views {

struct ViewModel {
  std::unique_ptr<DiffusionModel> model;
  at::Tensor x, t;  // [B, C, H, W] float, [B] float (meta)
  Condition cond;   // labels [B] int64; features [B, Tc, Dc] and lengths [B] when the model takes them
  // The eager forward (every module's hooks fire) -> [B, out, H, W].
  at::Tensor forward() const;
  // A training loss of that forward: the mean squared error against a
  // target of the output's shape (the objective's arithmetic, shapes only).
  at::Tensor loss() const;
};

// Throws UsageError for a batch < 1 or an invalid config.
ViewModel meta_model(const DiTConfig& cfg, int64_t batch);

}  // namespace perftrain::models::views
