// Rectified flow (flow matching on straight paths): x_t = (1 - t) x0 + t noise,
// the model predicts the velocity noise - x0; t = 1 is pure noise, so t * 1000
// runs the same direction as DDPM timesteps and DiT's timestep embedding
// sees the same range. Sampling integrates dx/dt = v from t = 1 to t = 0.
#pragma once

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>

#include <cstdint>

#include "diffusion/model_fn.h"
#include "diffusion/objective.h"

namespace perftrain::diffusion {

struct FlowOptions {
  TimeSampling time_sampling = TimeSampling::Uniform;
  double logit_mean = 0.0;  // logit-normal: t = sigmoid(N(logit_mean, logit_std^2))
  double logit_std = 1.0;
};

class RectifiedFlow {
 public:
  explicit RectifiedFlow(FlowOptions options = {});

  const FlowOptions& options() const { return options_; }

  // Training times in [0, 1], float32 [batch] with `options`' device.
  at::Tensor sample_time(int64_t batch, at::Generator& gen, const at::TensorOptions& options) const;

  // Draws t then noise from `gen` (on x0's device), then training_loss_at.
  LossTerms training_loss(const ModelFn& model, const at::Tensor& x0, const at::Tensor& y,
                          at::Generator& gen) const;

  // MSE between the model's velocity and noise - x0 at given t (float [B] in
  // [0, 1]) and noise. The model sees t * 1000. A 2C-channel output (a DiT
  // built with learn_sigma) is allowed: only its first C channels are used.
  // LossTerms::vb stays undefined.
  LossTerms training_loss_at(const ModelFn& model, const at::Tensor& x0, const at::Tensor& y,
                             const at::Tensor& t, const at::Tensor& noise) const;

  // Euler from x_1 = noise to x_0 in `steps` uniform steps; no autograd;
  // returns float32.
  at::Tensor euler_sample(const ModelFn& model, at::Tensor noise, const at::Tensor& y,
                          int steps) const;

 private:
  FlowOptions options_;
};

}  // namespace perftrain::diffusion
