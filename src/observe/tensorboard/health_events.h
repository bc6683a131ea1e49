// A gradient-health sample (observe/grad_health.h) as named scalars and
// histograms, at the sample's step, for the run's loggers (TensorBoard takes
// both; observe/log/logger.h): the global gradient norm, and per module (a
// DiT block, an embedder, the final layer) its gradient norm, max |g|, share
// of zeros and update/weight ratio; the global NaN/Inf count always, a
// module's where it has any.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "observe/grad_health.h"
#include "observe/tensorboard/event_writer.h"

namespace perftrain::observe::tensorboard {

// Tags: grad/global_norm, grad/global_update_ratio, grad/nonfinite (0 too);
// grad_norm/<module>, grad_max/<module>, grad_zero_share/<module>,
// update_ratio/<module>, grad_nonfinite/<module> (when > 0); a looped
// model's grad/loop<i>/<part> norms.
std::vector<std::pair<std::string, double>> grad_health_scalars(const GradHealthSample& sample);

// The sample's per-module gradient histograms (when it has them), tagged
// grad/<module>, over observe::grad_histogram_limits() with the empty buckets
// at either end left out; a module whose gradient held NaN/Inf or has no
// element gets none.
std::vector<std::pair<std::string, Histogram>> grad_health_histograms(const GradHealthSample& sample);

}  // namespace perftrain::observe::tensorboard
