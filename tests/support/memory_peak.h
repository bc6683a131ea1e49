// What the memory-estimate GPU tests (DiT's memory_estimate_gpu_test.cpp and
// the single-stream family's single_stream_memory_gpu_test.cpp) share: the
// short synthetic training run on 4x32x32 latents whose caching-allocator
// peak the estimate is held to, and the estimate and peak of one case.
#pragma once

#include <optional>
#include <sstream>
#include <string>

#include "support/test_support.h"
#include "train/config.h"
#include "train/memory_estimate.h"
#include "train/trainer.h"

namespace perftrain::testing {

// 8 steps of `model` at `batch` on synthetic 4x32x32 latents of 1000 classes,
// logged every 4 steps, one sampling step, no checkpoints or samples on the
// way, in `dir`; `speed`: one [speed] override, or "".
inline train::TrainConfig memory_run_config(const std::string& model, int64_t batch, const std::string& speed,
                                            const std::string& dir) {
  train::TrainConfig c = train::default_config(true);
  train::apply_override(c, "model.name=\"" + model + "\"");
  train::apply_override(c, "data.source=\"synthetic\"");
  c.model.image_size = 32;
  c.model.in_channels = 4;
  c.model.num_classes = 1000;
  c.data.synthetic_size = 1024;
  c.optim.batch_size = batch;
  c.optim.steps = 8;
  c.log.every = 4;
  c.log.sample_every = 0;
  c.log.checkpoint_every = 0;
  c.log.sample_classes = 1;
  c.log.sample_per_class = 1;
  c.diffusion.sample_steps = 1;
  c.run.dir = dir;
  c.run.name = "m";
  if (!speed.empty()) train::apply_override(c, speed);
  return c;
}

// The estimate for config c and the peak of running it (GiB), with the
// estimate's breakdown and the run's log.
struct EstimateAndPeak {
  double estimate_gib = 0;
  std::optional<double> peak_gib;
  std::string breakdown, log;
  double off() const { return peak_gib ? (estimate_gib - *peak_gib) / *peak_gib : 0; }
};

inline EstimateAndPeak estimate_and_peak(const train::TrainConfig& c) {
  constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
  EstimateAndPeak r;
  const train::MemoryEstimate e = train::estimate_training_memory(c, true, "auto");
  r.estimate_gib = e.total_bytes() / kGiB;
  r.breakdown = e.breakdown();
  std::ostringstream log;
  r.peak_gib = train::run_training(c, train::TrainOptions{}, log).peak_memory_gib;
  r.log = log.str();
  return r;
}

}  // namespace perftrain::testing
