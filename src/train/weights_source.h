// Weights to start from or convert, wherever they are: a torch.save file
// (io/torch_pickle.h: a state dict, or the "ema" / "model" entry of a
// training checkpoint), a safetensors weights file (perftrain's carry their
// config in the metadata; its checksums are checked), or a run / ckpt / step
// directory (the latest checkpoint's ema.safetensors or model.safetensors).
// `perftrain convert` and `perftrain train --init-from` read through here.
#pragma once

#include <optional>
#include <string>

#include "io/safetensors.h"
#include "models/dit_shapes.h"
#include "train/config.h"

namespace perftrain::train {

struct WeightsSource {
  io::NamedTensors tensors;
  std::optional<TrainConfig> config;  // the metadata's (perftrain files); none for other files
  std::string description;            // what was read, for reports: the file and the weights taken
};

// weights: "ema" or "model" (which weights of a checkpoint, directory or
// torch.save training checkpoint), or "" for the default: EMA. UsageError
// naming the path when it is none of the above, or holds no such weights.
WeightsSource read_weights(const std::string& path, const std::string& weights = "");

// The model the weights are for: their config's, else inferred from the
// tensors' shapes (DiT names; models/dit_shapes.h) with the hints.
models::DiTConfig model_of(const WeightsSource& source, const models::ShapeHints& hints);

// A config to store with converted weights: the GPU defaults with `model`
// (guidance only where the model has the null class).
TrainConfig config_for_model(const models::DiTConfig& model);

}  // namespace perftrain::train
