// Exponential moving average of the weights, kept in a second model of the
// same architecture (so it is sampled from and saved like any model):
//   ema <- decay * ema + (1 - decay) * param, one fused foreach launch.
// With warm-up the decay is min(decay, (1 + s) / (10 + s)) at update s, so
// that the average is useful after hundreds of steps, not only after 1/(1-d);
// before train.ema_start the EMA copies the weights (decay 0), and the
// warm-up counts from there.
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

#include "kernels/optimizer_schedule.h"

namespace perftrain::train {

// The decay of update `update` (0-based), kernels/optimizer_schedule.h's
// closed form (train.ema_start: the updates before it copy the weights).
double ema_decay_at(int64_t update, const kernels::EmaSchedule& schedule);
double ema_decay_at(int64_t update, double decay, bool warmup);  // ema_start 0
// ema[i] <- d * ema[i] + (1 - d) * params[i]
void ema_update_(const std::vector<at::Tensor>& ema, const std::vector<at::Tensor>& params, double d);

}  // namespace perftrain::train
