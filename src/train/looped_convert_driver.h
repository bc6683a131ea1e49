// `perftrain convert SOURCE --to looped`: a trained DiT (or single-stream
// DiT) as a looped model (models/looped_convert.h has the math). The source
// is a run, ckpt or step directory (its EMA or model weights) or a weights
// file that carries its config; the looped config is the source's with
// model.family looped, model.loop_block the source's family, the looped keys
// given (--set model.loops=..., model.lora_rank=...; model.loops by default
// fills the depth: (depth - prelude - coda) / shared_group) and
// model.lora_bias on for DiT blocks. Writes
//   OUT.safetensors          the LoopedDiT's weights, the config in their
//                            metadata (what `perftrain sample --ckpt` reads)
//   OUT/ (another path)      OUT/model.safetensors as above and
//                            OUT/config.toml (for `perftrain train --config
//                            OUT/config.toml`, starting from the weights)
// complete or not at all. Prints the reconstruction error per loop layer and
// target, what the conversion loses, and the output difference between the
// source and the converted model on a random batch.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

#include "models/diffusion_model.h"
#include "train/config.h"

namespace perftrain::train {

struct LoopedConvertOptions {
  std::string input, out;
  std::string weights = "ema";            // a directory's ema or model weights
  std::string shared = "mean";            // mean | layer:<i>
  std::vector<std::string> overrides;     // --set section.key=value, applied to the looped config
  uint64_t seed = 0;                      // the looped model's own tensors (routers) are drawn from it
};

// The looped config of a source config with the overrides (UsageError, one
// line, naming the key, when the two cannot match: models/looped_convert.h).
TrainConfig looped_config_for(const TrainConfig& source, const std::vector<std::string>& overrides,
                              const std::string& shared);

// The looped model converted from `source` (built on the CPU in float32),
// the lines to print about it appended to `log`.
std::unique_ptr<models::DiffusionModel> convert_model_to_looped(const models::DiffusionModel& source,
                                                                const TrainConfig& looped, const std::string& shared,
                                                                uint64_t seed, std::ostream& log);

// Reads, converts and writes as the top of this file says; UsageError before
// anything is written.
void run_looped_convert(const LoopedConvertOptions& options, std::ostream& log);

}  // namespace perftrain::train
