// The learning rate at a step (1-based): train.lr_schedule's closed forms
// (kernels/optimizer_schedule.h: one definition, which the device optimizer
// evaluates on the device inside the captured step and the host path here),
// and the config's names for them.
#pragma once

#include <cstdint>
#include <string>

#include "kernels/optimizer_schedule.h"
#include "train/config.h"

namespace perftrain::train {

// The shape a train.lr_schedule value names (config validation has checked it).
kernels::LrShape lr_shape(const std::string& name);
// The schedule of a config: train.lr, lr_min, warmup_steps, steps,
// decay_fraction, lr_schedule.
kernels::LrSchedule lr_schedule(const OptimConfig& o);
// The EMA decay schedule of a config: train.ema_decay, ema_warmup, ema_start.
kernels::EmaSchedule ema_schedule(const OptimConfig& o);

inline double lr_at(int64_t step, const kernels::LrSchedule& s) {
  return kernels::lr_at(s, static_cast<double>(step));
}
// Linear warm-up from 0 over warmup_steps, then constant.
inline double lr_at(int64_t step, double base_lr, int64_t warmup_steps) {
  kernels::LrSchedule s;
  s.lr = base_lr, s.warmup_steps = warmup_steps;
  return lr_at(step, s);
}

}  // namespace perftrain::train
