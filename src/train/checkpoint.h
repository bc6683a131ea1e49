// Checkpoints: runs/<name>/ckpt/step_00001000/ holds
//   model.safetensors          the weights, reference state_dict names
//   ema.safetensors            the EMA weights, same names (load either into
//                              facebookresearch/DiT's model with load_state_dict)
//   trainer_state.safetensors  AdamW moments and step counters, the RNG state,
//                              fp8 runs' scaling states (fp8.<layer>.<tensor>:
//                              StepRunner::optimizer_state), and in its
//                              metadata the step and data position
// Both weight files carry the resolved config (TOML) in their metadata under
// "perftrain.config", so `perftrain sample` needs nothing else. Every file
// records the CRC32C of each tensor and of its header (metadata, names,
// dtypes, shapes; io/safetensors.h), checked whenever a checkpoint is loaded.
// A step directory is complete or absent: it is written as
// ckpt/.step_<step>.tmp.<pid> (every file fsynced), renamed into place, ckpt/
// fsynced, and only then ckpt/latest is replaced; pruning renames a directory
// out of the step names (ckpt/.step_<step>.old.<pid>) before removing it. A
// crash at any moment leaves the previous checkpoint as the latest good one,
// plus leftovers that the next trainer removes (clean_interrupted_saves in
// run_directory.h). Only these names are ever removed or pruned: a directory
// of another name, or a step_* directory that is not complete, is the user's.
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
// the oldest complete step directories beyond `keep`. Returns the step
// directory. Before it writes and again before it renames the step directory
// into place, it checks that this process still holds the run's lock
// (check_run_lock in run_lock.h; RuntimeError, nothing more written, if not).
std::string save_checkpoint(const std::string& ckpt_root, const TrainConfig& cfg,
                            const TrainerState& state, const models::DiffusionModel& model,
                            const models::DiffusionModel& ema, const io::NamedTensors& optimizer_state,
                            at::Generator gen, int64_t keep);

// Whether `name` is a step directory name save_checkpoint writes:
// "step_" and at least 8 digits.
bool is_step_dir_name(const std::string& name);

// Whether `name` (in a ckpt directory) is one of save_checkpoint's own
// temporaries: ".step_<digits>.tmp.<pid>" (being written) or
// ".step_<digits>.old.<pid>" (being removed). Only these are leftovers.
bool is_step_temp_name(const std::string& name);

// The checkpoint files missing from a directory (empty: it is complete).
std::vector<std::string> missing_checkpoint_files(const std::string& dir);

// The files of a step directory.
const std::vector<std::string>& checkpoint_files();

// The step directory ckpt_root/latest names. RuntimeError when `latest` names
// anything but a step directory of this ckpt directory (another run's path,
// an absolute path, garbage) or one that is absent or incomplete.
std::string latest_checkpoint_dir(const std::string& ckpt_root);

// A run directory, a ckpt directory or a step directory -> the step directory
// to resume from. Throws UsageError saying what was looked for, naming the
// missing files of an incomplete step directory.
std::string resolve_checkpoint_dir(const std::string& path);

// Restores everything save_checkpoint wrote into already-built objects; the
// optimizer's tensors are handed to load_optimizer.
TrainerState load_checkpoint(const std::string& step_dir, models::DiffusionModel& model, models::DiffusionModel& ema,
                             const std::function<void(const io::NamedTensors&)>& load_optimizer,
                             at::Generator& gen);

// Loads weights into a module: every tensor of the module must be in the file
// with the same shape (RuntimeError naming the tensor and both shapes) and a
// dtype of the same kind (a float weight takes F16/BF16/F32/F64 only;
// RuntimeError naming the tensor and dtype), and the file must hold no tensor
// the module lacks. The file's checksums (if it has them) are checked first:
// RuntimeError naming the first corrupt tensor or the corrupt header.
void load_weights(const std::string& path, nn::Module& module);

// The config stored in a weights file's metadata (UsageError if absent;
// RuntimeError if the file's header checksum does not match).
TrainConfig config_from_weights(const std::string& path);

}  // namespace perftrain::train
