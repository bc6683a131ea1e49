#include "train/lr_schedule.h"

#include "base/error.h"
#include "ops/multi_tensor_adamw.h"

namespace perftrain::train {

kernels::LrShape lr_shape(const std::string& name) {
  if (const std::optional<kernels::LrShape> shape = ops::lr_shape_named(name)) return *shape;
  throw UsageError("train.lr_schedule '" + name + "' (expected constant, cosine, linear or wsd)");
}

kernels::LrSchedule lr_schedule(const OptimConfig& o) {
  kernels::LrSchedule s;
  s.lr = o.lr, s.lr_min = o.lr_min, s.warmup_steps = o.warmup_steps, s.total_steps = o.steps;
  s.decay_fraction = o.decay_fraction, s.shape = lr_shape(o.lr_schedule);
  return s;
}

kernels::EmaSchedule ema_schedule(const OptimConfig& o) {
  return kernels::EmaSchedule{o.ema_decay, o.ema_warmup, o.ema_start};
}

}  // namespace perftrain::train
