// The training step `perftrain bench` and `perftrain profile` time, as the
// user describes it with the options both commands share (--model,
// --batch-size, --image-size, --in-channels, --num-classes, --precision,
// --device, --seed, --set, --out; cli/step_options.h adds them), and the
// anchors' config both build from it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "train/config.h"

namespace perftrain::train::bench {

struct StepSetup {
  std::string model = "DiT-S/2";
  std::string batch_sizes = "32";  // comma-separated (bench times each; profile takes one)
  int64_t image_size = 32, in_channels = 4, num_classes = 1000;
  std::string precision = "bf16";  // bf16 | fp16 | fp8: the mixed-precision variants' dtype
  std::string device = "auto";     // auto | cpu | cuda
  uint64_t seed = 0;
  std::vector<std::string> overrides;  // --set section.key=value, last word
  std::string out;                     // the output directory (the CLI fills in its default)
};

// Whether the step runs on CUDA: "cpu" asks nothing of CUDA; "cuda" without
// a visible GPU, or another word, is a UsageError naming --device.
bool use_cuda(const std::string& device);

// "32,256" -> {32, 256}; UsageError naming --batch-size for anything but
// positive integers.
std::vector<int64_t> parse_batch_sizes(const std::string& list);

// The anchors' step (as facebookresearch/DiT with learn_sigma off, label
// dropout 0.1, DDPM eps-MSE, AdamW lr 1e-4 without weight decay, clipping
// or LR warm-up) for s.model at s's latent shape and seed, on the device.
// Neither --set nor validation yet: each command sets its own keys first,
// then finish_config.
TrainConfig anchor_config(const StepSetup& s, bool cuda);

// s.overrides over cfg, then cfg validated (UsageError naming the key).
// The mixed-precision variants' dtype: --precision, or fp8 where --set
// train.precision=fp8 asks for it (cfg: the anchors' config with --set).
std::string mixed_precision(const StepSetup& s, const TrainConfig& cfg);

void finish_config(TrainConfig& cfg, const StepSetup& s);
// UsageError unless train.accumulate is 1 (the timed step is one batch's).
void check_one_micro_batch(const TrainConfig& cfg);

// UsageError naming --batch-size when the memory estimate of cfg's step
// (train/memory_estimate.h, at cfg.optim.batch_size) exceeds what the device
// has, with the largest batch that fits; before anything is allocated.
void check_batch_fits(const TrainConfig& cfg, bool cuda, int optimizer_shards = 1);

}  // namespace perftrain::train::bench
