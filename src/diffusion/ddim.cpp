// DDIM sampling (Song et al. 2020) as guided-diffusion's ddim_sample_loop on a
// respaced schedule: the model sees the original timestep, the update uses
// alpha_bar at the visited timesteps, and alpha_bar_prev = 1 after the last.
#include <ATen/core/grad_mode.h>
#include <ATen/ops/full.h>
#include <ATen/ops/randn.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "base/error.h"
#include "diffusion/ddpm.h"

namespace perftrain::diffusion {

std::vector<int64_t> GaussianDiffusion::ddim_timesteps(int64_t num_timesteps, int steps) {
  if (steps < 1 || steps > num_timesteps)
    throw UsageError("ddim: steps must be in [1, " + std::to_string(num_timesteps) + "], got " +
                     std::to_string(steps));
  if (steps == 1) return {num_timesteps - 1};
  // Accumulated float stride rounded half-to-even, exactly as DiT's
  // space_timesteps does it (Python round), so the visited steps match.
  const double stride = static_cast<double>(num_timesteps - 1) / (steps - 1);
  std::vector<int64_t> ts;
  double cur = 0.0;
  for (int i = 0; i < steps; ++i) {
    ts.push_back(static_cast<int64_t>(std::nearbyint(cur)));
    cur += stride;
  }
  return ts;
}

at::Tensor GaussianDiffusion::ddim_sample(const ModelFn& model, at::Tensor noise,
                                          const at::Tensor& y, int steps, double eta,
                                          bool clip_x0, at::Generator* gen) const {
  if (eta < 0.0) throw UsageError("ddim: eta must be >= 0");
  if (eta > 0.0 && gen == nullptr) throw UsageError("ddim: eta > 0 needs a generator");
  if (noise.dim() < 2) throw UsageError("ddim: noise must be [B, C, ...]");
  const std::vector<int64_t> ts = ddim_timesteps(num_timesteps_, steps);
  at::NoGradGuard no_grad;
  const int64_t B = noise.size(0);
  const int64_t C = noise.size(1);
  at::Tensor x = noise.to(at::kFloat);
  for (int k = static_cast<int>(ts.size()) - 1; k >= 0; --k) {
    const at::Tensor t = at::full({B}, static_cast<double>(ts[k]), x.options());
    const at::Tensor out = model(x, t, y).to(at::kFloat);
    if (out.size(1) != C && out.size(1) != 2 * C)
      throw UsageError("ddim: model returned " + std::to_string(out.size(1)) +
                       " channels for a " + std::to_string(C) + "-channel input");
    const at::Tensor eps_model = out.narrow(1, 0, C);  // learned variance unused

    const double ab = alphas_cumprod_[ts[k]];
    const double ab_prev = k > 0 ? alphas_cumprod_[ts[k - 1]] : 1.0;
    const double sqrt_recip = std::sqrt(1.0 / ab);
    const double sqrt_recipm1 = std::sqrt(1.0 / ab - 1.0);
    at::Tensor pred_x0 = x.mul(sqrt_recip).sub(eps_model.mul(sqrt_recipm1));
    if (clip_x0) pred_x0 = pred_x0.clamp(-1.0, 1.0);
    // eps consistent with the (possibly clipped) x0, as guided-diffusion does.
    const at::Tensor eps = x.mul(sqrt_recip).sub(pred_x0).div(sqrt_recipm1);
    const double sigma =
        eta * std::sqrt((1.0 - ab_prev) / (1.0 - ab)) * std::sqrt(1.0 - ab / ab_prev);
    x = pred_x0.mul(std::sqrt(ab_prev))
            .add(eps.mul(std::sqrt(std::max(0.0, 1.0 - ab_prev - sigma * sigma))));
    if (k > 0 && sigma > 0.0) x = x.add(at::randn(x.sizes(), *gen, x.options()).mul(sigma));
  }
  return x;
}

}  // namespace perftrain::diffusion
