// End-to-end training on the CPU with a tiny DiT on synthetic data: the loss
// falls, the run directory is complete, a resumed run is bit-identical to an
// uninterrupted one, the metrics and TensorBoard hold the gradient values the
// docs promise, and report.md describes the whole run across resumes.
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "base/error.h"
#include "models/dit.h"
#include "base/fs.h"
#include "io/safetensors.h"
#include "support/run_checks.h"
#include "support/event_reader.h"
#include "support/test_support.h"
#include "train/checkpoint.h"
#include "train/run_segments.h"
#include "train/trainer.h"

namespace perftrain::train {
namespace {

using perftrain::testing::expect_resume_bit_identical;
using perftrain::testing::metrics_lines;
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

class ResumeTest : public ::testing::TestWithParam<std::string> {};

TEST_P(ResumeTest, ResumedRunIsBitIdenticalToAnUninterruptedOne) {
  TempDir tmp;
  std::ostringstream log;
  const int64_t n = 7;  // odd, so the resume point is not a logging step; 40 samples / 8 = 5 batches an epoch
  expect_resume_bit_identical(
      [&](const std::string& name, int64_t steps) { return tiny(tmp.path(), name, steps, GetParam()); }, tmp.path(), n,
      log);
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
  EXPECT_NE(report.find("attention = 'auto', weight_grad_stream = 'auto', gemm_tune = 8"), std::string::npos)
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

// The CPU default has no clipping, so the host optimizer's step computed the
// norm only for its non-finite guard and the log never saw it.
TEST(Trainer, EveryMetricsLineCarriesTheGradientNorm) {
  TempDir tmp;
  std::ostringstream log;
  TrainConfig c = tiny(tmp.path(), "run", 6, "flow");
  c.optim.grad_clip = 0;
  run_training(c, {}, log);
  const auto lines = metrics_lines(tmp.path() + "/run");
  ASSERT_EQ(lines.size(), 3u);  // steps 2, 4, 6
  for (const auto& rec : lines) {
    ASSERT_TRUE(rec.contains("grad_norm")) << rec.dump();
    ASSERT_TRUE(rec["grad_norm"].is_number()) << rec.dump();
    EXPECT_GT(rec["grad_norm"].get<double>(), 0) << rec.dump();
  }
}

// TensorBoard: grad/nonfinite (0 on a healthy run) and the other global
// gradient scalars at every monitored step, train/grad_norm at every window.
TEST(Trainer, TensorBoardHasTheGradientScalarsAtEveryMonitoredStep) {
  TempDir tmp;
  std::ostringstream log;
  TrainConfig c = tiny(tmp.path(), "run", 8, "flow");
  apply_override(c, "health.monitor_every=2");
  apply_override(c, "log.tensorboard=true");
  run_training(c, {}, log);
  namespace er = perftrain::testing::event_reader;
  std::map<std::string, std::vector<int64_t>> steps;
  for (const er::Event& e : er::read_events(er::only_event_file(tmp.path() + "/run/tb"))) {
    if (e.tag.rfind("grad/", 0) != 0 && e.tag != "train/grad_norm") continue;
    if (e.value.count(2) == 0) continue;  // a histogram
    steps[e.tag].push_back(e.step);
    if (e.tag == "grad/nonfinite") EXPECT_EQ(er::scalar_of(e), 0.0f) << e.step;
    if (e.tag == "train/grad_norm") EXPECT_GT(er::scalar_of(e), 0.0f) << e.step;
  }
  const std::vector<int64_t> monitored = {2, 4, 6, 8};
  EXPECT_EQ(steps["grad/global_norm"], monitored);
  EXPECT_EQ(steps["grad/global_update_ratio"], monitored);
  EXPECT_EQ(steps["grad/nonfinite"], monitored);
  EXPECT_EQ(steps["train/grad_norm"], monitored);  // the windows (log.every = 2)
}

std::string report_of(const std::string& run_dir) { return perftrain::testing::read_raw(run_dir + "/report.md"); }

void resume(const std::string& runs, const std::string& run, int64_t steps, std::ostringstream& log) {
  TrainOptions opts;
  opts.resume = run;
  run_training(tiny(runs, "", steps, "flow"), opts, log);
}

// A resume used to overwrite report.md with that segment alone ("steps 8 to
// 8", "0 steps/s"): the report covers the whole run, with one row per segment.
TEST(Report, DescribesTheWholeRunAcrossResumes) {
  TempDir tmp;
  std::ostringstream log;
  run_training(tiny(tmp.path(), "run", 7, "flow"), {}, log);
  const std::string run = tmp.path() + "/run";
  resume(tmp.path(), run, 8, log);  // one step: nothing timed in this segment
  std::string r = report_of(run);
  EXPECT_NE(r.find("| steps | 1 to 8, batch 8; 8 steps in 2 segments (below) |"), std::string::npos) << r;
  EXPECT_NE(r.find("| ranks | 1 process, batch 8 |"), std::string::npos) << r;
  EXPECT_EQ(r.find("| speed | 0 steps/s"), std::string::npos) << r;
  EXPECT_NE(r.find(" steps/s, "), std::string::npos) << r;  // the first segment's speed
  EXPECT_NE(r.find("| 1 to 7 | 1 process, batch 8 | CPU"), std::string::npos) << r;
  EXPECT_NE(r.find("| reached train.steps = 7 |"), std::string::npos) << r;
  EXPECT_NE(r.find("| 8 to 8 | 1 process, batch 8 | CPU"), std::string::npos) << r;
  EXPECT_NE(r.find("| n/a (one step) |"), std::string::npos) << r;
  EXPECT_NE(r.find("| reached train.steps = 8 |"), std::string::npos) << r;
  EXPECT_NE(r.find("| last samples | " + run + "/samples/step_00000008.png |"), std::string::npos) << r;
  // The loss row: the first window of the run (step 2), not of this segment.
  const auto lines = metrics_lines(run);
  ASSERT_GE(lines.size(), 2u);
  std::ostringstream first;
  first << lines.front()["loss"].get<double>() << " (first window)";
  EXPECT_NE(r.find("| loss | " + first.str()), std::string::npos) << r;

  // A third segment from the checkpoint at step 6: the steps after it are gone.
  resume(tmp.path(), run + "/ckpt/step_00000006", 9, log);
  r = report_of(run);
  EXPECT_NE(r.find("| steps | 1 to 9, batch 8; 9 steps in 2 segments (below) |"), std::string::npos) << r;
  EXPECT_NE(r.find("| 1 to 6 | "), std::string::npos) << r;
  EXPECT_NE(r.find("| continued from step 6 |"), std::string::npos) << r;
  EXPECT_NE(r.find("| 7 to 9 | "), std::string::npos) << r;
  EXPECT_EQ(r.find("| 8 to 8 | "), std::string::npos) << r;
}

// segments.jsonl as a resume reads it: the segments up to the checkpoint's
// step, the last one cut there; a record written at a checkpoint by a process
// that ended without a report; steps from before the file existed.
TEST(Report, SegmentsAreCutAtTheResumedStep) {
  TempDir tmp;
  const std::string path = tmp.file("segments.jsonl");
  RunSegment a, b;
  a.first_step = 1, a.last_step = 4, a.ranks = 2, a.batch_size = 6, a.end = "stopped by SIGTERM";
  b.first_step = 5, b.last_step = 9, b.ranks = 1, b.batch_size = 6, b.last_checkpoint = "ckpt/step_00000009";
  write_run_segments(path, {a, b});
  auto s = read_run_segments(path, 9);
  ASSERT_EQ(s.size(), 2u);
  EXPECT_EQ(s[0].ranks, 2);
  EXPECT_EQ(s[0].end, "stopped by SIGTERM");
  EXPECT_EQ(s[1].last_step, 9);
  EXPECT_EQ(s[1].end, "");
  s = read_run_segments(path, 6);
  ASSERT_EQ(s.size(), 2u);
  EXPECT_EQ(s[1].last_step, 6);
  EXPECT_EQ(s[1].end, "continued from step 6");
  EXPECT_EQ(s[1].last_checkpoint, "");
  s = read_run_segments(path, 3);
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s[0].last_step, 3);
  s = read_run_segments(path, 12);  // steps 10-12 have no record
  ASSERT_EQ(s.size(), 3u);
  EXPECT_EQ(s[2].first_step, 10);
  EXPECT_FALSE(s[2].recorded());
  s = read_run_segments(tmp.file("absent.jsonl"), 220);
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s[0].first_step, 1);
  EXPECT_EQ(s[0].last_step, 220);
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
