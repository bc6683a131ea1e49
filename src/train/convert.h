// perftrain convert: weights from one layout into another. The input is
// anything read_weights reads (train/weights_source.h: a torch.save file, a
// safetensors weights file, a run directory); its model is the config the
// file carries or the one its shapes describe (printed), and the weights are
// first loaded, strictly, into that perftrain model (train/init_from.h), so
// that only weights perftrain can train are written. A target (--to) is one
// function over that model: adding a layout is one function and one row of
// convert_targets().
#pragma once

#include <iosfwd>
#include <string>
#include <vector>

#include "models/diffusion_model.h"
#include "models/dit_shapes.h"
#include "train/config.h"

namespace perftrain::train {

struct ConvertOptions {
  std::string input, out;
  std::string to = "perftrain";  // a name of convert_targets()
  std::string weights;           // "", "ema" or "model": read_weights's choice
  models::ShapeHints hints;      // --model, --heads: for files without a config
};

// What a target writes from: the loaded model and the config to record.
struct ConvertInput {
  const models::DiffusionModel& model;
  const TrainConfig& config;
};

struct ConvertTarget {
  const char* name;
  const char* help;  // what `out` becomes
  // UsageError, before anything is read, where `out` cannot be written.
  void (*check_out)(const std::string& out);
  // Writes `out`, complete or not at all; returns one line saying what it wrote.
  std::string (*write)(const ConvertInput& in, const std::string& out);
};

// perftrain: one safetensors weights file with the config in its metadata;
// diffusers: a DiTTransformer2DModel directory (config.json and
// diffusion_pytorch_model.safetensors; models/dit_diffusers.h).
const std::vector<ConvertTarget>& convert_targets();

// Checks the options, reads, prints the model, loads, writes. UsageError
// (one line, naming the option, file or tensor) before anything is written.
void run_convert(const ConvertOptions& opts, std::ostream& log);

}  // namespace perftrain::train
