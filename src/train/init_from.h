// Weights from elsewhere into a model: `perftrain train --init-from PATH`
// (a new run, step 0 and a fresh optimizer, from a .pt, a safetensors
// weights file or a run directory's latest EMA weights) and `perftrain
// convert` (a strict load into the model the shapes describe). Tensors are
// matched by name. A class table (y_embedder.embedding_table.weight) of
// another row count, with --init-from, keeps the model's own
// initialisation, as DiT fine-tuning on a new label set does (the rows'
// meaning changes with the labels); a fixed, untrained tensor (pos_embed,
// another image size) keeps the model's own values. Any other tensor
// missing, unexpected or of another shape is an error naming it.
#pragma once

#include <string>
#include <vector>

#include "io/safetensors.h"
#include "models/diffusion_model.h"

namespace perftrain::train {

struct LoadReport {
  int64_t loaded = 0;
  std::vector<std::string> reinitialised;  // "name: [rows, D] in the weights, [rows', D] here"
  std::vector<std::string> kept;           // fixed tensors the model computes, with why
};

// Copies `source` into the model's tensors (same objects: an optimizer or
// EMA holding them sees the new values). new_class_count: a class table of
// another row count is re-initialised rather than refused. UsageError, one
// line, naming `what` and the first missing, unexpected or reshaped tensor
// (with the counts of each), or a tensor of an integer dtype.
LoadReport load_named_weights(const io::NamedTensors& source, models::DiffusionModel& model, bool new_class_count,
                              const std::string& what);

// One line: what was loaded, re-initialised and kept.
std::string describe(const LoadReport& report);

// --init-from: the weights at `path` into the model, and the EMA set to
// them. Returns the line to print (which weights were read, and the report).
std::string init_from_weights(const std::string& path, models::DiffusionModel& model, models::DiffusionModel& ema);

}  // namespace perftrain::train
