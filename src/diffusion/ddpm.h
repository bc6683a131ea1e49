// DDPM as in DiT (facebookresearch/DiT diffusion/, itself OpenAI's
// guided-diffusion): linear beta schedule, epsilon prediction, MSE loss, and
// for a model with learned variance (LEARNED_RANGE) the hybrid loss MSE + VLB.
// Also the DDIM sampler (ddim.cpp).
//
// Schedule tables are computed once in float64 (as guided-diffusion does in
// numpy) and kept on the device as float32, gathered per sample with
// index_select: the training loss has no host syncs and can be captured in a
// CUDA graph, provided the tables are already on the device (call to()).
#pragma once

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <vector>

#include "diffusion/model_fn.h"

namespace perftrain::diffusion {

class GaussianDiffusion {
 public:
  // DiT's schedule: betas = linspace(beta_start, beta_end, num_timesteps).
  explicit GaussianDiffusion(int64_t num_timesteps = 1000, double beta_start = 1e-4,
                             double beta_end = 0.02);

  int64_t num_timesteps() const { return num_timesteps_; }

  // Moves the float32 tables to `device`. Tables also follow x0 on demand, but
  // that copy is a host->device transfer: do it before capturing a graph.
  void to(const c10::Device& device);

  // Float64 host tables, indexed by timestep (guided-diffusion's names).
  const std::vector<double>& betas() const { return betas_; }
  const std::vector<double>& alphas_cumprod() const { return alphas_cumprod_; }
  const std::vector<double>& posterior_variance() const { return posterior_variance_; }
  const std::vector<double>& posterior_log_variance_clipped() const {
    return posterior_log_variance_clipped_;
  }

  // t ~ uniform integers in [0, num_timesteps), int64 [batch] on `device`.
  at::Tensor sample_timesteps(int64_t batch, at::Generator& gen, const c10::Device& device) const;

  // x_t = sqrt(abar_t) x0 + sqrt(1 - abar_t) noise; t: int64 [B]. Float32.
  at::Tensor q_sample(const at::Tensor& x0, const at::Tensor& t, const at::Tensor& noise) const;

  // Draws t and noise from `gen` (on x0's device), then training_loss_at.
  LossTerms training_loss(const ModelFn& model, const at::Tensor& x0, const at::Tensor& y,
                          at::Generator& gen, bool learn_sigma) const;

  // The loss at given t (int64 [B]) and noise (x0's shape). The model must
  // return C channels, or 2C ([eps, v], v in [-1, 1]) when learn_sigma.
  // loss = mean_b(mse_b + vb_b); vb sees eps detached, so it trains v only.
  LossTerms training_loss_at(const ModelFn& model, const at::Tensor& x0, const at::Tensor& y,
                             const at::Tensor& t, const at::Tensor& noise, bool learn_sigma) const;

  // guided-diffusion's _vb_terms_bpd (clip_denoised=False) for a model that
  // predicted eps and the variance interpolant v: per sample [B], bits/dim.
  // KL(q(x_{t-1}|x_t,x0) || p(x_{t-1}|x_t)) for t > 0, decoder NLL at t == 0.
  at::Tensor vb_terms_bpd(const at::Tensor& eps, const at::Tensor& v, const at::Tensor& x0,
                          const at::Tensor& x_t, const at::Tensor& t) const;

  // DDIM from `noise` (x_T) on `steps` evenly spaced timesteps (ddim_timesteps),
  // using only the eps half of a 2C-channel output. eta > 0 adds noise drawn
  // from *gen (required then). clip_x0 clamps the predicted x0 to [-1, 1].
  // Runs without autograd; returns float32 x_0.
  at::Tensor ddim_sample(const ModelFn& model, at::Tensor noise, const at::Tensor& y, int steps,
                         double eta = 0.0, bool clip_x0 = false,
                         at::Generator* gen = nullptr) const;

  // The timesteps DDIM visits, ascending: round(i * (T-1) / (steps-1)) for
  // i < steps (DiT's space_timesteps with one section, so 0 and T-1 are both
  // included); steps == 1 gives {T-1}. 1 <= steps <= T.
  static std::vector<int64_t> ddim_timesteps(int64_t num_timesteps, int steps);

 private:
  // Rows of the device table; a single [kRows, T] tensor so that one
  // index_select gathers every coefficient a loss needs.
  enum Row : int64_t {
    kSqrtAlphasCumprod,
    kSqrtOneMinusAlphasCumprod,
    kSqrtRecipAlphasCumprod,
    kSqrtRecipm1AlphasCumprod,
    kLogBetas,
    kPosteriorLogVarianceClipped,
    kPosteriorMeanCoef1,
    kPosteriorMeanCoef2,
    kRows
  };
  // The table on `device` (moved there and cached on first use).
  const at::Tensor& table_on(const c10::Device& device) const;
  // Gathered rows [kRows, B, 1, ..., 1] broadcastable against a dim-`dim` x.
  at::Tensor gather(const at::Tensor& t, int64_t dim, const c10::Device& device) const;

  int64_t num_timesteps_;
  std::vector<double> betas_, alphas_cumprod_, posterior_variance_,
      posterior_log_variance_clipped_;
  at::Tensor host_table_;            // float32 [kRows, T] on the CPU
  mutable at::Tensor device_table_;  // host_table_ on the last device used
};

}  // namespace perftrain::diffusion
