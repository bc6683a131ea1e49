#include "diffusion/flow.h"

#include <ATen/core/grad_mode.h>
#include <ATen/ops/full.h>
#include <ATen/ops/rand.h>
#include <ATen/ops/randn.h>

#include <cmath>
#include <string>
#include <vector>

#include "base/error.h"
#include "diffusion/vlb.h"

namespace perftrain::diffusion {

namespace {
// The velocity part of a C- or 2C-channel output, in float32.
at::Tensor velocity(const at::Tensor& out, const at::Tensor& x, const char* what) {
  const int64_t C = x.size(1);
  if (out.dim() != x.dim() || out.size(0) != x.size(0) ||
      (out.size(1) != C && out.size(1) != 2 * C))
    throw UsageError(std::string(what) + ": model returned " + std::to_string(out.size(1)) +
                     " channels for a " + std::to_string(C) + "-channel input");
  return out.narrow(1, 0, C).to(at::kFloat);
}

// [B] -> [B, 1, ..., 1] to broadcast against a dim-`dim` tensor.
at::Tensor per_sample(const at::Tensor& t, int64_t dim) {
  std::vector<int64_t> shape(static_cast<size_t>(dim), 1);
  shape[0] = t.size(0);
  return t.view(shape);
}
}  // namespace

RectifiedFlow::RectifiedFlow(FlowOptions options) : options_(options) {
  if (!(options_.logit_std > 0.0) || !std::isfinite(options_.logit_std) ||
      !std::isfinite(options_.logit_mean))
    throw UsageError("flow: logit-normal needs a finite mean and std > 0");
}

at::Tensor RectifiedFlow::sample_time(int64_t batch, at::Generator& gen,
                                      const at::TensorOptions& options) const {
  const at::TensorOptions opts = options.dtype(at::kFloat);
  if (options_.time_sampling == TimeSampling::Uniform) return at::rand({batch}, gen, opts);
  // Logit-normal (SD3): concentrates training on the middle of the path.
  return at::randn({batch}, gen, opts).mul(options_.logit_std).add(options_.logit_mean).sigmoid();
}

LossTerms RectifiedFlow::training_loss(const ModelFn& model, const at::Tensor& x0,
                                       const at::Tensor& y, at::Generator& gen) const {
  if (x0.dim() < 2) throw UsageError("flow training_loss: x0 must be [B, C, ...]");
  const at::Tensor t = sample_time(x0.size(0), gen, x0.options());
  const at::Tensor noise = at::randn(x0.sizes(), gen, x0.options().dtype(at::kFloat));
  return training_loss_at(model, x0, y, t, noise);
}

LossTerms RectifiedFlow::training_loss_at(const ModelFn& model, const at::Tensor& x0,
                                          const at::Tensor& y, const at::Tensor& t_in,
                                          const at::Tensor& noise_in) const {
  if (x0.dim() < 2) throw UsageError("flow training_loss: x0 must be [B, C, ...]");
  if (t_in.dim() != 1 || t_in.size(0) != x0.size(0))
    throw UsageError("flow training_loss: t must be [B] with B = x0.size(0)");
  if (noise_in.sizes() != x0.sizes())
    throw UsageError("flow training_loss: noise must have x0's shape");
  const at::Tensor x = x0.to(at::kFloat);
  const at::Tensor noise = noise_in.to(at::kFloat);
  const at::Tensor t = t_in.to(x0.device(), at::kFloat);
  const at::Tensor tb = per_sample(t, x.dim());
  const at::Tensor x_t = tb.neg().add(1.0).mul(x).add(tb.mul(noise));
  const at::Tensor v = velocity(model(x_t, t.mul(1000.0), y), x, "flow training_loss");
  const at::Tensor mse = mean_flat(noise.sub(x).sub(v).square());
  LossTerms terms;
  terms.loss = mse.mean();
  terms.mse = terms.loss.detach();
  return terms;
}

at::Tensor RectifiedFlow::euler_sample(const ModelFn& model, at::Tensor noise, const at::Tensor& y,
                                       int steps) const {
  if (steps < 1) throw UsageError("flow: sampling steps must be >= 1");
  if (noise.dim() < 2) throw UsageError("flow: noise must be [B, C, ...]");
  at::NoGradGuard no_grad;
  at::Tensor x = noise.to(at::kFloat);
  const int64_t B = x.size(0);
  for (int i = 0; i < steps; ++i) {
    const double t = 1.0 - static_cast<double>(i) / steps;
    const double t_next = 1.0 - static_cast<double>(i + 1) / steps;
    const at::Tensor tt = at::full({B}, t * 1000.0, x.options());
    x = x.add(velocity(model(x, tt, y), x, "flow sample").mul(t_next - t));
  }
  return x;
}

}  // namespace perftrain::diffusion
