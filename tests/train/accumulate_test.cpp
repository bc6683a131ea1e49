// Gradient accumulation on the CPU: N micro-batches of B train as one batch
// of N x B (the same rows, the same draws: label dropout, timesteps and
// noise are drawn for the whole step and split, so only the summation order
// differs); a resumed accumulated run with a cosine schedule is
// bit-identical to an uninterrupted one and logs the schedule's LR; the
// memory estimate counts one micro-batch's activations.
#include <gtest/gtest.h>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/ops/randint.h>
#include <ATen/ops/randn.h>

#include <cmath>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "base/error.h"
#include "io/safetensors.h"
#include "models/dit.h"
#include "support/test_support.h"
#include "train/lr_schedule.h"
#include "train/memory_estimate.h"
#include "train/step_runner.h"
#include "train/trainer.h"

namespace perftrain::train {
namespace {

using perftrain::testing::TempDir;

TrainConfig with(TrainConfig c, const std::vector<std::string>& overrides) {
  for (const auto& o : overrides) apply_override(c, o);
  return c;
}

// A tiny DiT on the CPU with label dropout, clipping, warm-up and weight decay.
TrainConfig tiny_cpu(int64_t batch, int64_t accumulate, const std::string& objective) {
  return with(default_config(false),
              {"model.depth=2", "model.hidden=32", "model.heads=2", "model.patch=2", "model.image_size=4",
               "model.in_channels=2", "model.num_classes=3", "model.class_dropout=0.3", "train.lr=1e-2",
               "train.grad_clip=0.5", "train.warmup_steps=2", "train.weight_decay=0.05",
               "diffusion.objective=" + objective, std::string("model.learn_sigma=") + (objective == "ddpm" ? "true" : "false"),
               "train.batch_size=" + std::to_string(batch), "train.accumulate=" + std::to_string(accumulate)});
}

struct Trained {
  std::vector<double> losses;
  std::vector<at::Tensor> weights;  // the model's, then the EMA's
};

// `steps` steps on fixed batches of 8 rows from fresh models (seed 1) and a
// generator seeded 5.
Trained train(const TrainConfig& c, int steps) {
  const at::Device cpu(at::kCPU);
  auto built = models::build_model_and_ema(c.model, 1, cpu);
  StepOptions o;
  o.precision = "fp32";
  StepRunner r(*built.model, built.ema.get(), c, o, cpu, at::make_generator<at::CPUGeneratorImpl>(5));
  auto data_gen = at::make_generator<at::CPUGeneratorImpl>(11);
  Trained t;
  for (int i = 0; i < steps; ++i) {
    data::Batch b{at::randn({8, 2, 4, 4}, data_gen), at::randint(3, {8}, data_gen, at::kLong)};
    r.step(b);
    t.losses.push_back(r.take_window().loss);
  }
  for (auto& p : built.model->parameters()) t.weights.push_back(p.detach().clone());
  for (auto& p : built.ema->parameters()) t.weights.push_back(p.detach().clone());
  return t;
}

class AccumulateTest : public ::testing::TestWithParam<std::string> {};

TEST_P(AccumulateTest, MicroBatchesTrainAsOneBigBatch) {
  const Trained big = train(tiny_cpu(8, 1, GetParam()), 4);
  for (const int64_t n : {2, 4}) {
    const Trained acc = train(tiny_cpu(8 / n, n, GetParam()), 4);
    for (size_t i = 0; i < big.losses.size(); ++i)
      EXPECT_NEAR(acc.losses[i], big.losses[i], 1e-5 * std::abs(big.losses[i])) << n << " micro-batches, step " << i + 1;
    for (size_t i = 0; i < big.weights.size(); ++i) {
      const double diff = acc.weights[i].sub(big.weights[i]).abs().max().item<double>();
      EXPECT_LT(diff, 1e-5) << n << " micro-batches, tensor " << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Objectives, AccumulateTest, ::testing::Values("ddpm", "flow"));

TEST(Accumulate, ABatchThatDoesNotSplitIsAUsageError) {
  const TrainConfig c = tiny_cpu(4, 2, "flow");
  const at::Device cpu(at::kCPU);
  auto built = models::build_model_and_ema(c.model, 1, cpu);
  StepOptions o;
  o.precision = "fp32";
  StepRunner r(*built.model, built.ema.get(), c, o, cpu, at::make_generator<at::CPUGeneratorImpl>(5));
  data::Batch b{at::randn({7, 2, 4, 4}), at::randint(3, {7}, at::kLong)};
  const std::string msg = perftrain::testing::error_of<UsageError>([&] { r.step(b); });
  EXPECT_NE(msg.find("train.accumulate = 2"), std::string::npos) << msg;
}

// tiny_cpu's model as a run on synthetic 8x8 data: 2 micro-batches of 4, a
// cosine schedule to lr_min, the EMA from step 2, a checkpoint every 3 steps.
TrainConfig tiny_run(const std::string& runs, int64_t steps) {
  TrainConfig c = with(tiny_cpu(4, 2, "flow"),
                       {"model.patch=4", "model.image_size=8", "data.source=synthetic", "data.synthetic_size=40",
                        "train.lr=1e-3", "train.warmup_steps=3", "train.lr_schedule=cosine", "train.lr_min=1e-4",
                        "train.ema_start=2", "train.device=cpu", "log.every=1", "log.checkpoint_every=3",
                        "log.keep_checkpoints=10", "log.sample_every=0", "diffusion.sample_steps=2",
                        "log.sample_per_class=2", "log.tensorboard=false", "run.dir=" + runs, "run.name=run"});
  c.optim.steps = steps;
  return c;
}

std::vector<nlohmann::json> metrics(const std::string& run) {
  std::ifstream in(run + "/metrics.jsonl");
  std::vector<nlohmann::json> out;
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) out.push_back(nlohmann::json::parse(line));
  return out;
}

// The data order, the generator, the optimizer and the schedules all resume
// exactly: a run resumed from its step-9 checkpoint (mid-epoch, mid-decay:
// the cosine spans the same train.steps) ends with the checkpoint the
// uninterrupted run ended with, bit for bit. Every metrics line carries the
// schedule's LR at its step.
TEST(Accumulate, ResumedAccumulatedRunIsBitIdenticalAndLogsTheSchedule) {
  TempDir tmp;
  std::ostringstream log;
  const TrainConfig cfg = tiny_run(tmp.path(), 14);  // 40 samples / 8 a step: 5 steps an epoch
  auto whole = run_training(cfg, {}, log);
  std::map<std::string, std::vector<std::pair<std::string, at::Tensor>>> final_files;
  for (const char* f : {"/model.safetensors", "/ema.safetensors", "/trainer_state.safetensors"}) {
    auto file = io::SafetensorsFile::open(whole.last_checkpoint + f);
    for (const auto& name : file.names()) final_files[f].emplace_back(name, file.get(name).clone());
  }
  TrainOptions opts;
  opts.resume = tmp.path() + "/run/ckpt/step_00000009";
  auto resumed = run_training(cfg, opts, log);
  EXPECT_EQ(resumed.first_step, 10);
  ASSERT_EQ(resumed.last_checkpoint, whole.last_checkpoint);
  for (const auto& [f, tensors] : final_files) {
    auto again = io::SafetensorsFile::open(resumed.last_checkpoint + f);
    ASSERT_EQ(again.names().size(), tensors.size()) << f;
    for (const auto& [name, t] : tensors) EXPECT_TRUE(again.get(name).equal(t)) << f << ": " << name;
  }
  const auto s = lr_schedule(cfg.optim);
  const auto lines = metrics(tmp.path() + "/run");
  ASSERT_GE(lines.size(), 12u);
  for (const auto& line : lines) {
    if (!line.contains("lr")) continue;
    const int64_t step = line["step"];
    EXPECT_DOUBLE_EQ(line["lr"].get<double>(), lr_at(step, s)) << "step " << step;
  }
  EXPECT_NE(log.str().find("gradient accumulation: 2 micro-batches of 4 per step, 8 samples per optimizer step"),
            std::string::npos)
      << log.str();
}

// The activations are one micro-batch's: N micro-batches of B need about
// what one batch of B needs (plus the step's batch buffers), far less than
// one batch of N x B.
TEST(Accumulate, MemoryEstimateCountsOneMicroBatchOfActivations) {
  TrainConfig c = default_config(true);
  c.optim.batch_size = 64;
  const MemoryEstimate one = estimate_training_memory(c, true, "bf16");
  c.optim.accumulate = 8;
  const MemoryEstimate acc = estimate_training_memory(c, true, "bf16");
  c.optim.accumulate = 1;
  c.optim.batch_size = 512;
  const MemoryEstimate big = estimate_training_memory(c, true, "bf16");
  auto part = [](const MemoryEstimate& e, const std::string& what) {
    for (const auto& [name, bytes] : e.parts)
      if (name == what) return bytes;
    return -1.0;
  };
  EXPECT_EQ(part(acc, "activations"), part(one, "activations"));
  EXPECT_GT(part(acc, "batches"), 7 * part(one, "batches"));
  EXPECT_GT(acc.total_bytes(), one.total_bytes());
  EXPECT_LT(acc.total_bytes(), 0.5 * big.total_bytes());
}

}  // namespace
}  // namespace perftrain::train
