// Checkpoints: runs/<name>/ckpt/step_00001000/ holds
//   model.safetensors          the weights, reference state_dict names
//   ema.safetensors            the EMA weights, same names (load either into
//                              facebookresearch/DiT's model with load_state_dict)
//   trainer_state.safetensors  AdamW moments and step counters, the RNG state,
//                              and in its metadata the step and data position
// Both weight files carry the resolved config (TOML) in their metadata under
// "perftrain.config", so `perftrain sample` needs nothing else. Every file
// records the CRC32C of each tensor (io/safetensors.h), checked whenever a
// checkpoint is loaded.
// A step directory is complete or absent: it is written as
// ckpt/.step_<step>.tmp.<pid> (every file fsynced), renamed into place, ckpt/
// fsynced, and only then ckpt/latest is replaced; pruning renames a directory
// out of the step names (ckpt/.step_<step>.old.<pid>) before removing it. A
// crash at any moment leaves the previous checkpoint as the latest good one,
// plus leftovers that the next trainer removes (remove_interrupted_saves in
// run_directory.h).
#pragma once

#include <ATen/core/Generator.h>

#include <functional>
#include <string>
#include <vector>

#include "data/batch_loader.h"
#include "models/diffusion_model.h"
#include "io/safetensors.h"
#include "train/config.h"

namespace perftrain::train {

struct TrainerState {
  int64_t step = 0;
  data::LoaderPosition position;
};

// Writes ckpt_root/step_<step>/ and points ckpt_root/latest at it; removes
// the oldest step directories beyond `keep`. Returns the step directory.
std::string save_checkpoint(const std::string& ckpt_root, const TrainConfig& cfg,
                            const TrainerState& state, const models::DiffusionModel& model,
                            const models::DiffusionModel& ema, const io::NamedTensors& optimizer_state,
                            at::Generator gen, int64_t keep);

// Whether ckpt_root/name is something an interrupted save or prune left: a
// temporary step directory, or a step_* directory missing one of its files.
bool is_interrupted_step_dir(const std::string& ckpt_root, const std::string& name);

// The files of a step directory.
const std::vector<std::string>& checkpoint_files();

// A run directory, a ckpt directory or a step directory -> the step directory
// to resume from. Throws UsageError saying what was looked for.
std::string resolve_checkpoint_dir(const std::string& path);

// Restores everything save_checkpoint wrote into already-built objects; the
// optimizer's tensors are handed to load_optimizer.
TrainerState load_checkpoint(const std::string& step_dir, models::DiffusionModel& model, models::DiffusionModel& ema,
                             const std::function<void(const io::NamedTensors&)>& load_optimizer,
                             at::Generator& gen);

// Loads weights into a module: every tensor of the module must be in the file
// with the same shape (RuntimeError naming the tensor and both shapes), and
// the file must hold no tensor the module lacks. The file's checksums (if it
// has them) are checked first: RuntimeError naming the first corrupt tensor.
void load_weights(const std::string& path, nn::Module& module);

// The config stored in a weights file's metadata (UsageError if absent).
TrainConfig config_from_weights(const std::string& path);

}  // namespace perftrain::train
