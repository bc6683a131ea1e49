// Training on the GPU (bf16 autocast, pinned-memory loader): the loss falls,
// and a resumed run continues from the saved state (on the GPU the kernels are
// not bitwise deterministic, so it is compared within a tolerance). Skips
// without a GPU.
#include <gtest/gtest.h>

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

TEST(TrainerGpu, LossFallsInBf16AndResumeContinues) {
  if (!compat::cuda_available()) GTEST_SKIP() << "no GPU";
  TempDir tmp;
  std::ostringstream log;
  auto whole = run_training(small_gpu(tmp.path(), "whole", 200), {}, log);
  EXPECT_LT(whole.final_loss, 0.6 * whole.first_loss) << log.str();
  ASSERT_TRUE(whole.peak_memory_gib.has_value());
  EXPECT_GT(*whole.peak_memory_gib, 0.0);
  EXPECT_NE(log.str().find("bf16"), std::string::npos);
  EXPECT_EQ(whole.step_mode.rfind("captured", 0), 0u) << whole.step_mode;  // the whole-step CUDA graph ran

  auto half = run_training(small_gpu(tmp.path(), "half", 100), {}, log);
  TrainConfig more = config_from_weights(half.last_checkpoint + "/model.safetensors");
  more.optim.steps = 200;
  TrainOptions opts;
  opts.resume = tmp.path() + "/half";
  auto resumed = run_training(more, opts, log);
  EXPECT_EQ(resumed.first_step, 101);
  EXPECT_NEAR(resumed.final_loss, whole.final_loss, 0.1 * whole.final_loss) << log.str();
}

}  // namespace
}  // namespace perftrain::train
