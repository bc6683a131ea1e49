#include "train/sampling.h"

#include <ATen/core/grad_mode.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/zeros.h>
#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>

#include "diffusion/ddpm.h"
#include "diffusion/flow.h"
#include "diffusion/guidance.h"
#include "io/png.h"
#include "compat/compat.h"

namespace perftrain::train {

at::Tensor sample_images(const models::DiffusionModel& model, const TrainConfig& cfg, const SampleOptions& opts,
                         const at::Device& device) {
  at::NoGradGuard no_grad;
  const auto& m = cfg.model;
  const int64_t classes = std::min(opts.classes, m.num_classes);
  const int64_t n = classes * opts.per_class;
  // Noise on the CPU from a fixed seed: the same grid on every device.
  auto gen = at::make_generator<at::CPUGeneratorImpl>(opts.seed);
  auto noise = at::randn({n, m.in_channels, m.image_size, m.image_size}, gen, at::kFloat).to(device);
  auto y = at::arange(classes, at::TensorOptions().dtype(at::kLong))
               .repeat_interleave(opts.per_class)
               .to(device);

  const bool bf16 = opts.bf16 && device.is_cuda();
  const bool features = m.single_stream() && m.cond_dim > 0;
  diffusion::ModelFn fn = [&](const at::Tensor& x, const at::Tensor& t, const at::Tensor& lab) {
    compat::AutocastGuard autocast(device.type(), at::kBFloat16, bf16);
    models::Condition cond{lab, {}, {}};
    if (features) {
      cond.features = at::zeros({x.size(0), m.cond_tokens, m.cond_dim}, x.options().dtype(at::kFloat));
      cond.lengths = at::zeros({x.size(0)}, x.options().dtype(at::kLong));
    }
    return model.forward(x, t, cond).to(at::kFloat);
  };
  if (opts.cfg_scale != 1.0 && m.class_dropout > 0 && !features)
    fn = diffusion::classifier_free_guidance(fn, m.num_classes, opts.cfg_scale);

  if (cfg.diffusion.objective == "flow") {
    diffusion::RectifiedFlow flow;
    return flow.euler_sample(fn, noise, y, static_cast<int>(opts.steps));
  }
  diffusion::GaussianDiffusion ddpm;
  ddpm.to(device);
  return ddpm.ddim_sample(fn, noise, y, static_cast<int>(opts.steps));
}

void write_sample_grid(const std::string& path, const models::DiffusionModel& model, const TrainConfig& cfg,
                       const SampleOptions& opts, const at::Device& device) {
  auto images = sample_images(model, cfg, opts, device).cpu();
  const int64_t c = images.size(1);
  if (c != 1 && c != 3) images = images.narrow(1, 0, std::min<int64_t>(c, 3));
  if (images.size(1) == 2) images = images.narrow(1, 0, 1);
  io::save_png_grid(path, images, opts.per_class);
}

}  // namespace perftrain::train
