// Classifier-free guidance (Ho & Salimans 2022) as a ModelFn wrapper, so that
// every sampler gets it for free.
#pragma once

#include <cstdint>

#include "diffusion/model_fn.h"

namespace perftrain::diffusion {

// Returns a ModelFn that runs `model` once on the doubled batch
// ([x; x], [t; t], [y; null_label]) and returns, in float32,
// u + scale * (c - u) on the first C channels (C = x_t.size(1)), where c and
// u are the conditional and unconditional outputs; for a 2C-channel output
// the second half (learned variance) is the conditional one, unchanged.
// scale == 1 returns a plain call of `model` (no doubling, output as is).
ModelFn classifier_free_guidance(ModelFn model, int64_t null_label, double scale);

}  // namespace perftrain::diffusion
