// End-to-end training on the CPU with a tiny DiT on synthetic data: the loss
// falls, the run directory is complete, and a resumed run is bit-identical to
// an uninterrupted one.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "base/error.h"
#include "models/dit.h"
#include "base/fs.h"
#include "io/safetensors.h"
#include "support/test_support.h"
#include "train/checkpoint.h"
#include "train/trainer.h"

namespace perftrain::train {
namespace {

using perftrain::testing::TempDir;

TrainConfig tiny(const std::string& runs, const std::string& name, int64_t steps, const std::string& objective) {
  TrainConfig c = default_config(false);
  for (const char* o : {"model.depth=2", "model.hidden=32", "model.heads=2", "model.patch=4", "model.image_size=8",
                        "model.in_channels=2", "model.num_classes=3", "data.source=synthetic",
                        "data.synthetic_size=40", "train.batch_size=8", "train.lr=1e-3", "train.warmup_steps=3",
                        "train.grad_clip=1.0", "train.device=cpu", "log.every=2", "log.checkpoint_every=3",
                        "log.sample_every=0", "diffusion.sample_steps=2", "log.sample_per_class=2"})
    apply_override(c, o);
  apply_override(c, "diffusion.objective=" + objective);
  apply_override(c, std::string("model.learn_sigma=") + (objective == "ddpm" ? "true" : "false"));
  c.optim.steps = steps;
  c.run.dir = runs;
  c.run.name = name;
  return c;
}

void expect_identical(const std::string& a, const std::string& b) {
  auto fa = io::SafetensorsFile::open(a), fb = io::SafetensorsFile::open(b);
  ASSERT_EQ(fa.names(), fb.names());
  for (const auto& n : fa.names()) EXPECT_TRUE(fa.get(n).equal(fb.get(n))) << a << " vs " << b << ": " << n;
}

class ResumeTest : public ::testing::TestWithParam<std::string> {};

TEST_P(ResumeTest, ResumedRunIsBitIdenticalToAnUninterruptedOne) {
  TempDir tmp;
  std::ostringstream log;
  const int64_t n = 7;  // odd, so the resume point is not a logging step; 40 samples / 8 = 5 batches an epoch
  auto whole = run_training(tiny(tmp.path(), "whole", 2 * n, GetParam()), {}, log);
  auto half = run_training(tiny(tmp.path(), "half", n, GetParam()), {}, log);
  EXPECT_EQ(half.last_step, n);

  TrainConfig more = config_from_weights(half.last_checkpoint + "/model.safetensors");
  more.optim.steps = 2 * n;
  TrainOptions opts;
  opts.resume = tmp.path() + "/half";
  auto resumed = run_training(more, opts, log);
  EXPECT_EQ(resumed.first_step, n + 1);
  EXPECT_EQ(resumed.last_step, 2 * n);
  for (const char* f : {"/model.safetensors", "/ema.safetensors", "/trainer_state.safetensors"})
    expect_identical(whole.last_checkpoint + f, resumed.last_checkpoint + f);
}

INSTANTIATE_TEST_SUITE_P(Objectives, ResumeTest, ::testing::Values("ddpm", "flow"));

TEST(Trainer, LossFallsAndTheRunDirectoryIsComplete) {
  // Synthetic samples are class patterns plus noise: a working model and
  // trainer bring the eps-prediction MSE from 1 (the zero-initialised output)
  // to about a third of that within 150 steps.
  TempDir tmp;
  std::ostringstream log;
  TrainConfig c = tiny(tmp.path(), "run", 150, "ddpm");
  c.model.learn_sigma = false;
  c.optim.batch_size = 16;
  c.optim.lr = 3e-3;
  c.log.every = 30;
  auto s = run_training(c, {}, log);
  EXPECT_LT(s.final_loss, 0.6 * s.first_loss) << log.str();
  const std::string dir = tmp.path() + "/run";
  for (const char* f : {"/config.toml", "/metrics.jsonl", "/report.md", "/ckpt/latest"})
    EXPECT_TRUE(perftrain::testing::read_raw(dir + f).size() > 0) << f;
  // The report: the resolved [speed] keys, and n/a for what only CUDA measures.
  EXPECT_FALSE(s.peak_memory_gib.has_value()) << "no allocator statistics on the CPU";
  const std::string report = perftrain::testing::read_raw(dir + "/report.md");
  EXPECT_NE(report.find("| peak memory | n/a |"), std::string::npos) << report;
  EXPECT_NE(report.find("attention = 'own', weight_grad_stream = 'auto', gemm_tune = 8"), std::string::npos)
      << report;
  EXPECT_NE(perftrain::testing::read_raw(dir + "/config.toml").find("weight_grad_stream = 'auto'"),
            std::string::npos);
  EXPECT_EQ(s.last_samples, dir + "/samples/step_00000150.png");
  EXPECT_GT(perftrain::testing::read_raw(s.last_samples).size(), 8u);
  std::ifstream metrics(dir + "/metrics.jsonl");
  int lines = 0;
  for (std::string line; std::getline(metrics, line);) ++lines;
  EXPECT_EQ(lines, 5);  // steps 30..150; step 1 is timed apart
  // keep_checkpoints = 3 of steps 3, 6, ..., 150, plus the "latest" pointer
  EXPECT_EQ(fs::list_directory(dir + "/ckpt"),
            (std::vector<std::string>{"latest", "step_00000144", "step_00000147", "step_00000150"}));
}

TEST(Trainer, RefusesToOverwriteAnExistingRunAndToResumeWhenDone) {
  TempDir tmp;
  std::ostringstream log;
  auto c = tiny(tmp.path(), "run", 3, "flow");
  run_training(c, {}, log);
  EXPECT_THROW(run_training(c, {}, log), UsageError);
  TrainOptions opts;
  opts.resume = tmp.path() + "/run";
  EXPECT_THROW(run_training(c, opts, log), UsageError);  // already at step 3
}

TEST(Checkpoint, WrongShapesAndMissingTensorsNameTheTensor) {
  TempDir tmp;
  auto c = tiny(tmp.path(), "run", 1, "flow");
  models::DiT model(c.model, 0);
  io::save_safetensors(tmp.file("ok.safetensors"), model.state());
  models::DiTConfig wider = c.model;
  wider.hidden = 64;
  models::DiT other(wider, 0);
  auto msg = perftrain::testing::error_of<RuntimeError>([&] { load_weights(tmp.file("ok.safetensors"), other); });
  EXPECT_NE(msg.find("pos_embed"), std::string::npos) << msg;
  EXPECT_NE(msg.find("ok.safetensors"), std::string::npos) << msg;
  io::save_safetensors(tmp.file("partial.safetensors"), io::NamedTensors{model.state()[0]});
  msg = perftrain::testing::error_of<RuntimeError>([&] { load_weights(tmp.file("partial.safetensors"), model); });
  EXPECT_NE(msg.find("missing tensor"), std::string::npos) << msg;
}

}  // namespace
}  // namespace perftrain::train
