// Evaluation end to end on the CPU: the feature network trained on a tiny
// synthetic set, saved and loaded; eval.every inside a training run (EMA
// weights, between steps) into metrics.jsonl and TensorBoard; the sample
// batch of `sample --npz`; a latent model refused with a line naming the VAE.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "base/error.h"
#include "data/dataset.h"
#include "io/npz.h"
#include "models/diffusion_model.h"
#include "support/event_reader.h"
#include "support/test_support.h"
#include "train/eval/evaluation.h"
#include "train/eval/feature_net_training.h"
#include "train/sampling.h"
#include "train/trainer.h"

namespace perftrain::train {
namespace {

using perftrain::testing::contains;
using perftrain::testing::error_of;
using perftrain::testing::TempDir;

// A 1-channel 8 px model on synthetic data: pixel space, as Fashion-MNIST is.
TrainConfig tiny_pixels(const std::string& runs, int64_t steps) {
  TrainConfig c = default_config(false);
  for (const char* o : {"model.depth=1", "model.hidden=32", "model.heads=2", "model.patch=4", "model.image_size=8",
                        "model.in_channels=1", "model.num_classes=3", "data.source=synthetic",
                        "data.synthetic_size=32", "train.batch_size=8", "train.device=cpu", "log.every=2",
                        "log.checkpoint_every=0", "log.sample_every=0", "diffusion.sample_steps=2",
                        "diffusion.objective=flow", "model.learn_sigma=false", "log.tensorboard=true"})
    apply_override(c, o);
  c.optim.steps = steps;
  c.run.dir = runs;
  c.run.name = "run";
  return c;
}

std::string feature_net_file(const TempDir& tmp) {
  const auto train_set = data::make_synthetic(256, {1, 8, 8}, 3, 1);
  std::ostringstream log;
  eval::FeatureNetTraining o;
  o.batch_size = 64;
  const std::string path = tmp.file("features.safetensors");
  const auto r = eval::train_feature_net(*train_set, train_set.get(), path, o, at::kCPU, log);
  EXPECT_GE(r.test_accuracy, 0.0);
  EXPECT_TRUE(contains(log.str(), "epoch 1/1")) << log.str();
  return path;
}

TEST(Eval, FeatureNetworkInsideTrainingLogsEveryNSteps) {
  TempDir tmp;
  const std::string features = feature_net_file(tmp);
  const auto loaded = eval::load_feature_net(features, at::kCPU);
  EXPECT_EQ(loaded.reference.mu.numel(), models::FeatureNet::kFeatures);
  EXPECT_EQ(loaded.image_size, 8);

  TrainConfig c = tiny_pixels(tmp.path(), 4);
  apply_override(c, "eval.every=2");
  apply_override(c, "eval.samples=6");
  apply_override(c, "eval.features=\"" + features + "\"");
  std::ostringstream log;
  run_training(c, {}, log);

  std::ifstream metrics(tmp.file("run/metrics.jsonl"));
  std::vector<int64_t> steps;
  for (std::string line; std::getline(metrics, line);) {
    const auto j = nlohmann::json::parse(line);
    if (!j.contains("eval")) continue;
    steps.push_back(j["step"].get<int64_t>());
    EXPECT_GE(j["eval"]["fd_features"].get<double>(), 0.0);
    const double consistency = j["eval"]["class_consistency"].get<double>();
    EXPECT_TRUE(consistency >= 0 && consistency <= 1) << consistency;
  }
  EXPECT_EQ(steps, (std::vector<int64_t>{2, 4}));
  namespace er = perftrain::testing::event_reader;
  std::vector<int64_t> tb;
  for (const er::Event& e : er::read_events(er::only_event_file(tmp.file("run/tb"))))
    if (e.tag == "eval/fd_features") tb.push_back(e.step);
  EXPECT_EQ(tb, (std::vector<int64_t>{2, 4}));
}

TEST(Eval, EvalEveryWithoutANetworkIsAConfigError) {
  TrainConfig c = tiny_pixels("/nonexistent", 2);
  apply_override(c, "eval.every=2");
  EXPECT_TRUE(contains(error_of<UsageError>([&] { c.validate(); }), "eval.every > 0 needs eval.features"));
}

TEST(Eval, ALatentModelIsRefusedNamingTheMissingVae) {
  TempDir tmp;
  eval::EvalOptions o;
  o.features = feature_net_file(tmp);
  const eval::Evaluator evaluator(o, at::kCPU);
  TrainConfig c = tiny_pixels(tmp.path(), 2);
  apply_override(c, "model.in_channels=4");
  const std::string msg = error_of<UsageError>([&] { evaluator.check_model(c); });
  EXPECT_TRUE(contains(msg, "latents (4 channels)") && contains(msg, "VAE")) << msg;
  EXPECT_EQ(msg.find('\n'), std::string::npos);
}

TEST(Eval, SampleNpzIsAdmsBatchWithGrayRepeatedAndLabelsInTurn) {
  TempDir tmp;
  const TrainConfig c = tiny_pixels(tmp.path(), 1);
  const auto model = models::build_diffusion_model(c.model, 0, at::kCPU);
  SampleOptions o;
  o.steps = 2;
  o.cfg_scale = 1.0;
  std::vector<int64_t> progress;
  write_sample_npz(tmp.file("s.npz"), *model, c, o, 7, 3, at::kCPU, [&](int64_t n) { progress.push_back(n); });
  EXPECT_EQ(progress, (std::vector<int64_t>{3, 6, 7}));
  const auto arrays = io::read_npz(tmp.file("s.npz"));
  const at::Tensor images = arrays.at("arr_0");
  EXPECT_EQ(images.scalar_type(), at::kByte);
  ASSERT_EQ(images.sizes(), at::IntArrayRef({7, 8, 8, 3}));
  EXPECT_TRUE(images.select(3, 0).equal(images.select(3, 2)));
  EXPECT_TRUE(arrays.at("arr_1").equal(cycled_labels(0, 7, 3)));
  // Batch 0 is the noise of seed 0: the same images as sampling those labels directly.
  const at::Tensor first = to_uint8(sample_for_labels(*model, c, cycled_labels(0, 3, 3), o, at::kCPU));
  EXPECT_TRUE(images.narrow(0, 0, 3).select(3, 0).equal(first.select(1, 0)));
}

}  // namespace
}  // namespace perftrain::train
