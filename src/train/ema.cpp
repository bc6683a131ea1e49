#include "train/ema.h"

#include <ATen/core/grad_mode.h>
#include <ATen/ops/_foreach_lerp.h>

#include <algorithm>

namespace perftrain::train {

double ema_decay_at(int64_t update, double decay, bool warmup) {
  if (!warmup) return decay;
  return std::min(decay, (1.0 + update) / (10.0 + update));
}

void ema_update_(const std::vector<at::Tensor>& ema, const std::vector<at::Tensor>& params, double d) {
  at::NoGradGuard no_grad;
  // lerp(ema, p, 1 - d) = ema + (1 - d)(p - ema) = d*ema + (1 - d)*p
  at::_foreach_lerp_(ema, params, 1.0 - d);
}

}  // namespace perftrain::train
