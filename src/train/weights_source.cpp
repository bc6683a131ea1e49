#include "train/weights_source.h"

#include "base/error.h"
#include "base/fs.h"
#include "io/torch_pickle.h"
#include "train/checkpoint.h"

namespace perftrain::train {
namespace {

WeightsSource read_safetensors(const std::string& path, const std::string& description) {
  const auto file = io::SafetensorsFile::open(path);
  file.verify_checksums();
  WeightsSource s;
  for (const auto& name : file.names()) s.tensors.emplace_back(name, file.get(name));
  if (file.metadata().count("perftrain.config")) s.config = config_from_weights(path);
  s.description = description;
  return s;
}

}  // namespace

WeightsSource read_weights(const std::string& path, const std::string& weights) {
  if (weights != "" && weights != "ema" && weights != "model")
    throw UsageError("weights '" + weights + "': expected ema or model");
  if (!fs::exists(path)) throw UsageError(path + " does not exist");
  const std::string which = weights.empty() ? "ema" : weights;
  if (fs::is_directory(path)) {
    const std::string file = fs::join(resolve_checkpoint_dir(path), which + ".safetensors");
    return read_safetensors(file, file + " (the " + std::string(which == "ema" ? "EMA" : "model") + " weights of " +
                                      path + ")");
  }
  if (!io::torch_save_format(path).empty()) {
    auto sd = io::read_torch_state_dict(path, weights);
    WeightsSource s;
    s.tensors = std::move(sd.tensors);
    s.description = path + (sd.entry.empty() ? " (a state dict)" : " (its '" + sd.entry + "' entry)");
    return s;
  }
  if (!weights.empty())
    throw UsageError(path + " is one weights file; --weights " + weights +
                     " picks from a run directory or a torch.save checkpoint");
  return read_safetensors(path, path);
}

models::DiTConfig model_of(const WeightsSource& source, const models::ShapeHints& hints) {
  if (source.config) return source.config->model;
  models::TensorShapes shapes;
  for (const auto& [name, t] : source.tensors) shapes.emplace_back(name, t.sizes().vec());
  return models::dit_config_from_shapes(shapes, hints, source.description);
}

TrainConfig config_for_model(const models::DiTConfig& model) {
  TrainConfig cfg = default_config(true);
  cfg.model = model;
  if (model.class_dropout <= 0) cfg.diffusion.cfg_scale = 1.0;
  return cfg;
}

}  // namespace perftrain::train
