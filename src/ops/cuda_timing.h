// Timing for the choices the ops make on their first call of a shape (the
// attention plan, the DGELU form): the median of several runs of a closure,
// by CUDA events on the current stream. Syncs with the GPU: never inside a
// graph capture, and only where a choice is made once per shape.
#pragma once

#include <functional>

namespace perftrain::ops {

// The median milliseconds of `timed_runs` runs after `warmups` untimed ones.
double median_cuda_ms(const std::function<void()>& run, int warmups = 2, int timed_runs = 5);

}  // namespace perftrain::ops
