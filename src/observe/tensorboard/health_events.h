// A gradient-health sample (observe/grad_health.h) as TensorBoard scalars,
// at the sample's step: the global gradient norm, and per module (a DiT
// block, an embedder, the final layer) its gradient norm, max |g|, share of
// zeros and update/weight ratio; the global NaN/Inf count always, a
// module's where it has any.
#pragma once

#include "observe/grad_health.h"
#include "observe/tensorboard/event_writer.h"

namespace perftrain::observe::tensorboard {

// Tags: grad/global_norm, grad/global_update_ratio, grad/nonfinite (0 too);
// grad_norm/<module>, grad_max/<module>, grad_zero_share/<module>,
// update_ratio/<module>, grad_nonfinite/<module> (when > 0).
void add_grad_health(EventWriter& writer, const GradHealthSample& sample);

// The sample's per-module gradient histograms (when it has them) as
// histograms grad/<module>, over observe::grad_histogram_limits() with the
// empty buckets at either end left out; a module whose gradient held NaN/Inf
// or has no element gets none.
void add_grad_histograms(EventWriter& writer, const GradHealthSample& sample);

}  // namespace perftrain::observe::tensorboard
