// What the diffusion layer knows of a model: a function of the noisy input,
// the time and the class label. It knows nothing of DiT or of how the model is
// run (eager, captured, autocast): the trainer and sampler pass a closure.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>

namespace perftrain::diffusion {

// x_t: [B, C, H, W] float; t: [B] float32 in DiT timestep units (DDPM: the
// integer step 0..999 as float; flow: t * 1000 for t in [0, 1]); y: [B] int64
// class labels (the null class num_classes means "unconditional").
// Returns [B, C, H, W], or [B, 2C, H, W] for a model with learned variance.
using ModelFn =
    std::function<at::Tensor(const at::Tensor& x_t, const at::Tensor& t, const at::Tensor& y)>;

struct LossTerms {
  at::Tensor loss;  // scalar, what backward() is called on
  at::Tensor mse;   // scalar, the MSE part (detached)
  at::Tensor vb;    // scalar, the variational-bound part (detached); undefined without learned variance
  at::Tensor aux;   // scalar, the model's auxiliary loss in `loss` (detached); undefined without one
};

}  // namespace perftrain::diffusion
