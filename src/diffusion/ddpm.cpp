#include "diffusion/ddpm.h"

#include <ATen/ops/from_blob.h>
#include <ATen/ops/randint.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/where.h>

#include <cmath>
#include <string>

#include "base/error.h"
#include "diffusion/vlb.h"

namespace perftrain::diffusion {

GaussianDiffusion::GaussianDiffusion(int64_t num_timesteps, double beta_start, double beta_end)
    : num_timesteps_(num_timesteps) {
  if (num_timesteps < 2) throw UsageError("diffusion needs at least 2 timesteps");
  if (!(beta_start > 0.0 && beta_start <= beta_end && beta_end < 1.0))
    throw UsageError("diffusion betas must satisfy 0 < beta_start <= beta_end < 1");
  const int64_t T = num_timesteps;
  // np.linspace(beta_start, beta_end, T, dtype=float64), endpoint exact.
  betas_.resize(T);
  const double step = (beta_end - beta_start) / static_cast<double>(T - 1);
  for (int64_t i = 0; i < T; ++i) betas_[i] = static_cast<double>(i) * step + beta_start;
  betas_[T - 1] = beta_end;

  alphas_cumprod_.resize(T);
  posterior_variance_.resize(T);
  posterior_log_variance_clipped_.resize(T);
  std::vector<double> table(static_cast<size_t>(kRows * T));
  auto cell = [&](Row row, int64_t i) -> double& { return table[row * T + i]; };
  double prod = 1.0;
  for (int64_t i = 0; i < T; ++i) {
    const double prev = prod;  // alphas_cumprod_prev, 1 at t = 0
    prod *= 1.0 - betas_[i];
    alphas_cumprod_[i] = prod;
    posterior_variance_[i] = betas_[i] * (1.0 - prev) / (1.0 - prod);
    cell(kSqrtAlphasCumprod, i) = std::sqrt(prod);
    cell(kSqrtOneMinusAlphasCumprod, i) = std::sqrt(1.0 - prod);
    cell(kSqrtRecipAlphasCumprod, i) = std::sqrt(1.0 / prod);
    cell(kSqrtRecipm1AlphasCumprod, i) = std::sqrt(1.0 / prod - 1.0);
    cell(kLogBetas, i) = std::log(betas_[i]);
    cell(kPosteriorMeanCoef1, i) = betas_[i] * std::sqrt(prev) / (1.0 - prod);
    cell(kPosteriorMeanCoef2, i) = (1.0 - prev) * std::sqrt(1.0 - betas_[i]) / (1.0 - prod);
  }
  // The posterior variance is 0 at t = 0; its log is clipped to the t = 1 value.
  for (int64_t i = 0; i < T; ++i) {
    posterior_log_variance_clipped_[i] = std::log(posterior_variance_[i == 0 ? 1 : i]);
    cell(kPosteriorLogVarianceClipped, i) = posterior_log_variance_clipped_[i];
  }
  // to(kFloat) copies, so the tensor does not alias the local vector.
  host_table_ = at::from_blob(table.data(), {kRows, T}, at::kDouble).to(at::kFloat);
  device_table_ = host_table_;
}

void GaussianDiffusion::to(const c10::Device& device) { device_table_ = host_table_.to(device); }

const at::Tensor& GaussianDiffusion::table_on(const c10::Device& device) const {
  if (device_table_.device() != device) device_table_ = host_table_.to(device);
  return device_table_;
}

at::Tensor GaussianDiffusion::gather(const at::Tensor& t, int64_t dim,
                                     const c10::Device& device) const {
  std::vector<int64_t> shape(static_cast<size_t>(dim) + 1, 1);
  shape[0] = kRows;
  shape[1] = t.size(0);
  return table_on(device).index_select(1, t.to(device, at::kLong)).view(shape);
}

at::Tensor GaussianDiffusion::sample_timesteps(int64_t batch, at::Generator& gen,
                                               const c10::Device& device) const {
  return at::randint(num_timesteps_, {batch}, gen, at::TensorOptions(device).dtype(at::kLong));
}

namespace {
void check_batch(const at::Tensor& x0, const at::Tensor& t, const char* what) {
  if (x0.dim() < 2) throw UsageError(std::string(what) + ": x0 must be [B, C, ...]");
  if (t.dim() != 1 || t.size(0) != x0.size(0))
    throw UsageError(std::string(what) + ": t must be [B] with B = x0.size(0)");
}
}  // namespace

at::Tensor GaussianDiffusion::q_sample(const at::Tensor& x0, const at::Tensor& t,
                                       const at::Tensor& noise) const {
  check_batch(x0, t, "q_sample");
  if (noise.sizes() != x0.sizes()) throw UsageError("q_sample: noise must have x0's shape");
  const at::Tensor r = gather(t, x0.dim(), x0.device());
  return r.select(0, kSqrtAlphasCumprod)
      .mul(x0.to(at::kFloat))
      .add(r.select(0, kSqrtOneMinusAlphasCumprod).mul(noise.to(at::kFloat)));
}

LossTerms GaussianDiffusion::training_loss(const ModelFn& model, const at::Tensor& x0,
                                           const at::Tensor& y, at::Generator& gen,
                                           bool learn_sigma) const {
  // Same draw order as guided-diffusion: timesteps, then noise.
  const at::Tensor t = sample_timesteps(x0.size(0), gen, x0.device());
  const at::Tensor noise = at::randn(x0.sizes(), gen, x0.options().dtype(at::kFloat));
  return training_loss_at(model, x0, y, t, noise, learn_sigma);
}

LossTerms GaussianDiffusion::training_loss_at(const ModelFn& model, const at::Tensor& x0,
                                              const at::Tensor& y, const at::Tensor& t_in,
                                              const at::Tensor& noise_in, bool learn_sigma) const {
  check_batch(x0, t_in, "training_loss");
  if (noise_in.sizes() != x0.sizes()) throw UsageError("training_loss: noise must have x0's shape");
  const at::Tensor x = x0.to(at::kFloat);
  const at::Tensor noise = noise_in.to(at::kFloat);
  const at::Tensor t = t_in.to(x0.device(), at::kLong);
  const at::Tensor x_t = q_sample(x, t, noise);
  // Loss math in float32 whatever precision the model ran in.
  const at::Tensor out = model(x_t, t.to(at::kFloat), y).to(at::kFloat);

  const int64_t C = x.size(1);
  const int64_t want = learn_sigma ? 2 * C : C;
  if (out.dim() != x.dim() || out.size(0) != x.size(0) || out.size(1) != want)
    throw UsageError("training_loss: model returned " + std::to_string(out.size(1)) +
                     " channels, expected " + std::to_string(want) +
                     (learn_sigma ? " (learn_sigma: [eps, v])" : ""));
  const at::Tensor eps = out.narrow(1, 0, C);
  const at::Tensor mse = mean_flat(noise.sub(eps).square());

  LossTerms terms;
  terms.mse = mse.mean().detach();
  if (!learn_sigma) {
    terms.loss = mse.mean();
    return terms;
  }
  // The VLB trains only the variance: the mean is learned through the MSE.
  const at::Tensor vb = vb_terms_bpd(eps.detach(), out.narrow(1, C, C), x, x_t, t);
  terms.loss = mse.add(vb).mean();
  terms.vb = vb.mean().detach();
  return terms;
}

at::Tensor GaussianDiffusion::vb_terms_bpd(const at::Tensor& eps, const at::Tensor& v,
                                           const at::Tensor& x0, const at::Tensor& x_t,
                                           const at::Tensor& t) const {
  check_batch(x0, t, "vb_terms_bpd");
  if (eps.sizes() != x0.sizes() || v.sizes() != x0.sizes() || x_t.sizes() != x0.sizes())
    throw UsageError("vb_terms_bpd: eps, v, x_t must have x0's shape");
  const at::Tensor r = gather(t, x0.dim(), x0.device());
  const at::Tensor c1 = r.select(0, kPosteriorMeanCoef1);
  const at::Tensor c2 = r.select(0, kPosteriorMeanCoef2);
  const at::Tensor min_log = r.select(0, kPosteriorLogVarianceClipped);
  const at::Tensor max_log = r.select(0, kLogBetas);

  // True posterior q(x_{t-1} | x_t, x0).
  const at::Tensor true_mean = c1.mul(x0).add(c2.mul(x_t));
  // Model p(x_{t-1} | x_t): mean through the predicted x0 (not clipped),
  // log variance interpolated between the posterior's and beta_t's.
  const at::Tensor pred_x0 = r.select(0, kSqrtRecipAlphasCumprod)
                                 .mul(x_t)
                                 .sub(r.select(0, kSqrtRecipm1AlphasCumprod).mul(eps));
  const at::Tensor model_mean = c1.mul(pred_x0).add(c2.mul(x_t));
  const at::Tensor frac = v.add(1.0).div(2.0);
  const at::Tensor model_log_var = frac.mul(max_log).add(frac.neg().add(1.0).mul(min_log));

  const double ln2 = std::log(2.0);
  const at::Tensor kl =
      mean_flat(normal_kl(true_mean, min_log, model_mean, model_log_var)).div(ln2);
  const at::Tensor nll =
      mean_flat(discretized_gaussian_log_likelihood(x0, model_mean, model_log_var.mul(0.5)))
          .neg()
          .div(ln2);
  return at::where(t.eq(0), nll, kl);  // select, no host sync
}

}  // namespace perftrain::diffusion
