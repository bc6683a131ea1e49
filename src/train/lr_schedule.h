// The learning rate at a step (1-based): linear warm-up from 0 over
// warmup_steps, then constant (DiT trains at a constant 1e-4).
#pragma once

#include <algorithm>
#include <cstdint>

namespace perftrain::train {

inline double lr_at(int64_t step, double base_lr, int64_t warmup_steps) {
  if (warmup_steps <= 0) return base_lr;
  return base_lr * std::min(1.0, static_cast<double>(step) / static_cast<double>(warmup_steps));
}

}  // namespace perftrain::train
