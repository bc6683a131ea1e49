// Training on the GPU (bf16 autocast, pinned-memory loader): the loss falls,
// and a resumed run continues from the saved state (on the GPU the kernels are
// not bitwise deterministic, so it is compared within a tolerance). Skips
// without a GPU.
#include <gtest/gtest.h>

#include <iostream>
#include <sstream>

#include "io/safetensors.h"
#include "support/test_support.h"
#include "compat/compat.h"
#include "train/checkpoint.h"
#include "train/trainer.h"

namespace perftrain::train {
namespace {

using perftrain::testing::TempDir;

TrainConfig small_gpu(const std::string& runs, const std::string& name, int64_t steps) {
  TrainConfig c = default_config(true);
  for (const char* o : {"model.depth=2", "model.hidden=64", "model.heads=2", "model.patch=2", "model.image_size=8",
                        "model.in_channels=4", "model.num_classes=5", "model.learn_sigma=false",
                        "data.source=synthetic", "data.synthetic_size=512", "train.batch_size=64",
                        "train.lr=3e-3", "train.device=cuda", "log.every=25", "log.checkpoint_every=50",
                        "log.sample_every=0", "diffusion.sample_steps=4", "log.sample_per_class=2"})
    apply_override(c, o);
  c.optim.steps = steps;
  c.run.dir = runs;
  c.run.name = name;
  return c;
}

// A run whose exception carries the log: the failure says how the step ran
// and whether the monitored step's graph was captured.
TrainSummary run_logged(const TrainConfig& c, const TrainOptions& opts, std::ostringstream& log) {
  try {
    TrainSummary s = run_training(c, opts, log);
    std::cout << c.run.name << ": step " << s.step_mode << "; health " << s.health_monitor << "\n";
    return s;
  } catch (const std::exception& e) {
    ADD_FAILURE() << c.run.name << " threw: " << e.what() << "\nlog:\n" << log.str();
    throw;
  }
}

TEST(TrainerGpu, LossFallsInBf16AndResumeContinues) {
  if (!compat::cuda_available()) GTEST_SKIP() << "no GPU";
  TempDir tmp;
  std::ostringstream log;
  // This tiny model's step is short enough that the loader thread allocates
  // pinned batches while a graph is captured; the monitored step (every 50)
  // is captured after the first batches were freed, so those allocations
  // query CUDA events (compat::isolate_thread_from_graph_captures).
  auto whole = run_logged(small_gpu(tmp.path(), "whole", 200), {}, log);
  EXPECT_LT(whole.final_loss, 0.6 * whole.first_loss) << log.str();
  ASSERT_TRUE(whole.peak_memory_gib.has_value());
  EXPECT_GT(*whole.peak_memory_gib, 0.0);
  EXPECT_NE(log.str().find("bf16"), std::string::npos);
  EXPECT_EQ(whole.step_mode.rfind("captured", 0), 0u) << whole.step_mode;  // the whole-step CUDA graph ran
  EXPECT_EQ(whole.health_monitor.find("monitoring off"), std::string::npos) << whole.health_monitor;

  auto half = run_logged(small_gpu(tmp.path(), "half", 100), {}, log);
  TrainConfig more = config_from_weights(half.last_checkpoint + "/model.safetensors");
  more.optim.steps = 200;
  TrainOptions opts;
  opts.resume = tmp.path() + "/half";
  auto resumed = run_logged(more, opts, log);
  EXPECT_EQ(resumed.first_step, 101);
  EXPECT_NEAR(resumed.final_loss, whole.final_loss, 0.1 * whole.final_loss) << log.str();
}

}  // namespace
}  // namespace perftrain::train
