#include "train/sampling.h"

#include <ATen/TensorOperators.h>
#include <ATen/core/grad_mode.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/zeros.h>
#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>

#include "diffusion/ddpm.h"
#include "diffusion/flow.h"
#include "diffusion/guidance.h"
#include "base/error.h"
#include "io/atomic_file.h"
#include "io/npz.h"
#include "io/png.h"
#include "compat/compat.h"

namespace perftrain::train {

namespace {

// A grid's labels: the first opts.classes classes, opts.per_class each.
at::Tensor grid_labels(const TrainConfig& cfg, const SampleOptions& opts) {
  const int64_t classes = std::min(opts.classes, cfg.model.num_classes);
  return at::arange(classes, at::TensorOptions().dtype(at::kLong)).repeat_interleave(opts.per_class);
}

}  // namespace

at::Tensor sample_images(const models::DiffusionModel& model, const TrainConfig& cfg, const SampleOptions& opts,
                         const at::Device& device) {
  return sample_for_labels(model, cfg, grid_labels(cfg, opts), opts, device);
}

at::Tensor sample_for_labels(const models::DiffusionModel& model, const TrainConfig& cfg, const at::Tensor& labels,
                             const SampleOptions& opts, const at::Device& device) {
  at::NoGradGuard no_grad;
  const auto& m = cfg.model;
  const int64_t n = labels.size(0);
  // Noise on the CPU from a fixed seed: the same grid on every device.
  auto gen = at::make_generator<at::CPUGeneratorImpl>(opts.seed);
  auto noise = at::randn({n, m.in_channels, m.image_size, m.image_size}, gen, at::kFloat).to(device);
  const at::Tensor y = labels.to(device);

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

at::Tensor sample_pixels_for_labels(const models::DiffusionModel& model, const TrainConfig& cfg,
                                    const at::Tensor& labels, const SampleOptions& opts, const at::Device& device) {
  const at::Tensor samples = sample_for_labels(model, cfg, labels, opts, device);
  return opts.decoder ? opts.decoder.decode(samples) : samples;
}

int64_t image_size_of(const TrainConfig& cfg, const SampleOptions& opts) {
  return cfg.model.image_size * (opts.decoder ? opts.decoder.upscale : 1);
}

int64_t image_channels_of(const TrainConfig& cfg, const SampleOptions& opts) {
  return opts.decoder ? opts.decoder.channels : cfg.model.in_channels;
}

void write_sample_grid(const std::string& path, const models::DiffusionModel& model, const TrainConfig& cfg,
                       const SampleOptions& opts, const at::Device& device) {
  auto images = sample_pixels_for_labels(model, cfg, grid_labels(cfg, opts), opts, device).cpu();
  const int64_t c = images.size(1);
  if (c != 1 && c != 3) images = images.narrow(1, 0, std::min<int64_t>(c, 3));
  if (images.size(1) == 2) images = images.narrow(1, 0, 1);
  io::save_png_grid(path, images, opts.per_class);
}

at::Tensor cycled_labels(int64_t first, int64_t count, int64_t num_classes) {
  return at::arange(first, first + count, at::TensorOptions().dtype(at::kLong)).remainder(num_classes);
}

at::Tensor to_uint8(const at::Tensor& images) {
  return (images.to(at::kFloat) * 127.5f + 128.0f).clamp(0, 255).to(at::kByte);
}

void require_images(const TrainConfig& cfg, const SampleOptions& opts, const std::string& what) {
  const int64_t c = cfg.model.in_channels;
  if (!opts.decoder && (cfg.data.source == "latents" || (c != 1 && c != 3)))
    throw UsageError(what + ": this model makes latents (" + std::to_string(c) +
                     " channels); decoding them needs their VAE: --vae DIR (eval.vae in training), a diffusers "
                     "AutoencoderKL folder");
}

void write_sample_npz(const std::string& path, const models::DiffusionModel& model, const TrainConfig& cfg,
                      const SampleOptions& opts, int64_t n, int64_t batch_size, const at::Device& device,
                      const std::function<void(int64_t)>& progress) {
  require_images(cfg, opts, "--npz");
  const int64_t size = image_size_of(cfg, opts);
  io::write_file_atomic(path, [&](std::FILE* f) {
    io::NpzWriter w(f, path);
    at::Tensor labels = cycled_labels(0, n, cfg.model.num_classes);
    w.begin("arr_0", at::kByte, {n, size, size, 3});
    for (int64_t b = 0, done = 0; done < n; ++b, done += batch_size) {
      SampleOptions o = opts;
      o.seed = opts.seed + static_cast<uint64_t>(b);
      const int64_t count = std::min(batch_size, n - done);
      const at::Tensor images =
          to_uint8(sample_pixels_for_labels(model, cfg, labels.narrow(0, done, count), o, device));
      w.append(images.expand({count, 3, size, size}).permute({0, 2, 3, 1}).contiguous().cpu());
      if (progress) progress(done + count);
    }
    w.end();
    w.begin("arr_1", at::kLong, {n});
    w.append(labels);
    w.end();
    w.finish();
  });
}

}  // namespace perftrain::train
