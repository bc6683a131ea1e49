#include "train/ema.h"

#include <ATen/core/grad_mode.h>
#include <ATen/ops/_foreach_lerp.h>


namespace perftrain::train {

double ema_decay_at(int64_t update, const kernels::EmaSchedule& schedule) {
  return kernels::ema_decay_at(schedule, static_cast<double>(update));
}

double ema_decay_at(int64_t update, double decay, bool warmup) {
  return ema_decay_at(update, kernels::EmaSchedule{decay, warmup, 0});
}

void ema_update_(const std::vector<at::Tensor>& ema, const std::vector<at::Tensor>& params, double d) {
  at::NoGradGuard no_grad;
  // lerp(ema, p, 1 - d) = ema + (1 - d)(p - ema) = d*ema + (1 - d)*p
  at::_foreach_lerp_(ema, params, 1.0 - d);
}

}  // namespace perftrain::train
