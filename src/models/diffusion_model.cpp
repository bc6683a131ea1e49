#include "models/diffusion_model.h"

#include <future>

#include "models/dit.h"
#include "models/single_stream.h"

namespace perftrain::models {

std::unique_ptr<DiffusionModel> make_diffusion_model(const DiTConfig& cfg, uint64_t seed) {
  if (cfg.single_stream()) return std::make_unique<SingleStreamDiT>(cfg, seed);
  return std::make_unique<DiT>(cfg, seed);
}

std::unique_ptr<DiffusionModel> build_diffusion_model(const DiTConfig& cfg, uint64_t seed, const at::Device& device) {
  if (!cfg.single_stream()) return build_model(cfg, seed, device);
  auto m = std::make_unique<SingleStreamDiT>(cfg, seed, device);
  m->transform([](const std::string&, const at::Tensor& t) { return t; });  // marks trainable tensors
  return m;
}

DiffusionModelAndEma build_diffusion_model_and_ema(const DiTConfig& cfg, uint64_t seed, const at::Device& device) {
  DiffusionModelAndEma out;
  if (!cfg.single_stream()) {
    auto built = build_model_and_ema(cfg, seed, device);
    out.model = std::move(built.model);
    out.ema = std::move(built.ema);
    return out;
  }
  auto build = [&cfg, seed, device] { return build_diffusion_model(cfg, seed, device); };
  if (device.is_cpu()) {  // the CPU's draws are slow for large models: two threads
    auto ema = std::async(std::launch::async, build);
    out.model = build();
    out.ema = ema.get();
  } else {
    out.model = build();
    out.ema = build();
  }
  for (auto& p : out.ema->parameters()) p.set_requires_grad(false);
  return out;
}

}  // namespace perftrain::models
