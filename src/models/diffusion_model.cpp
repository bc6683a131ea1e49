#include "models/diffusion_model.h"

#include "models/dit.h"
#include "models/looped.h"
#include "models/single_stream.h"

namespace perftrain::models {

std::unique_ptr<DiffusionModel> make_diffusion_model(const DiTConfig& cfg, uint64_t seed) {
  if (cfg.looped()) return std::make_unique<LoopedDiT>(cfg, seed);
  if (cfg.single_stream()) return std::make_unique<SingleStreamDiT>(cfg, seed);
  return std::make_unique<DiT>(cfg, seed);
}

std::unique_ptr<DiffusionModel> build_diffusion_model(const DiTConfig& cfg, uint64_t seed, const at::Device& device) {
  if (cfg.family == "dit") return build_model(cfg, seed, device);
  std::unique_ptr<DiffusionModel> m;
  if (cfg.looped())
    m = std::make_unique<LoopedDiT>(cfg, seed, device);
  else
    m = std::make_unique<SingleStreamDiT>(cfg, seed, device);
  m->transform([](const std::string&, const at::Tensor& t) { return t; });  // marks trainable tensors
  return m;
}

DiffusionModelAndEma build_diffusion_model_and_ema(const DiTConfig& cfg, uint64_t seed, const at::Device& device) {
  return build_with_ema<DiffusionModelAndEma>([&cfg, seed, device] { return build_diffusion_model(cfg, seed, device); },
                                              device);
}

}  // namespace perftrain::models
