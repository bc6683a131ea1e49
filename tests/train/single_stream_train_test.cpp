// The single-stream DiT through the generic training path on the CPU: the
// loss falls with class tokens and with synthetic condition features, and a
// checkpoint round-trips into a fresh model (config from the weights file).
#include <gtest/gtest.h>

#include <ATen/TensorOperators.h>
#include <ATen/ops/rand.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/tensor.h>

#include <algorithm>
#include <sstream>

#include "base/error.h"
#include "data/batch_loader.h"
#include "data/dataset.h"
#include "io/safetensors.h"
#include "models/diffusion_model.h"
#include "support/test_support.h"
#include "train/checkpoint.h"
#include "train/trainer.h"

namespace perftrain::train {
namespace {

using perftrain::testing::TempDir;

TrainConfig tiny_ss(const std::string& runs, const std::string& name, int64_t cond_dim) {
  TrainConfig c = default_config(false);
  for (const char* o : {"model.name=SS-T/2", "model.depth=2", "model.hidden=64", "model.heads=2", "model.image_size=8",
                        "model.in_channels=2", "model.num_classes=4", "data.source=synthetic",
                        "data.synthetic_size=64", "train.batch_size=16", "train.lr=3e-3", "train.warmup_steps=5",
                        "train.grad_clip=1.0", "train.device=cpu", "log.every=10",
                        "diffusion.objective=ddpm", "model.learn_sigma=false", "log.sample_every=0",
                        "log.checkpoint_every=0", "diffusion.sample_steps=2", "log.sample_per_class=2",
                        "log.sample_classes=2", "model.cond_tokens=3"})
    apply_override(c, o);
  c.model.cond_dim = cond_dim;
  c.optim.steps = 120;
  c.run.dir = runs;
  c.run.name = name;
  return c;
}

// The eps-prediction MSE starts at 1 (the zero-initialised output); the
// class patterns of the synthetic data bring it well below that within 120
// steps when the model and its conditioning work.
TEST(SingleStreamTraining, LossFallsWithClassTokensAndTheCheckpointRoundTrips) {
  TempDir tmp;
  std::ostringstream log;
  const TrainConfig c = tiny_ss(tmp.path(), "cls", 0);
  const auto s = run_training(c, {}, log);
  EXPECT_LT(s.final_loss, 0.6 * s.first_loss) << log.str();
  EXPECT_NE(log.str().find("SS-T/2"), std::string::npos);

  const std::string w = s.last_checkpoint + "/ema.safetensors";
  const TrainConfig back = config_from_weights(w);
  EXPECT_EQ(back.model.family, "single-stream");
  EXPECT_EQ(back.model.cond_tokens, 3);
  auto m = models::make_diffusion_model(back.model, 99);
  load_weights(w, *m);
  auto file = io::SafetensorsFile::open(w);
  for (const auto& [name, t] : m->state()) EXPECT_TRUE(t.equal(file.get(name))) << name;
  const auto names = file.names();
  EXPECT_NE(names.end(), std::find(names.begin(), names.end(), "blocks.1.attn.q_norm.weight"));
  // A DiT cannot take these weights (a named tensor is missing).
  TrainConfig dit = back;
  dit.model.family = "dit";
  auto d = models::make_diffusion_model(dit.model, 0);
  EXPECT_ANY_THROW(load_weights(w, *d));
}

TEST(SingleStreamTraining, LossFallsWithSyntheticConditionFeatures) {
  TempDir tmp;
  std::ostringstream log;
  const auto s = run_training(tiny_ss(tmp.path(), "feat", 8), {}, log);
  EXPECT_LT(s.final_loss, 0.6 * s.first_loss) << log.str();
  EXPECT_NE(log.str().find("synthetic condition features 3x8"), std::string::npos) << log.str();
}

TEST(SingleStreamTraining, FeaturesNeedADatasetThatHasThem) {
  TempDir tmp;
  TrainConfig c = tiny_ss(tmp.path(), "bad", 8);
  c.data.source = "fashion-mnist";
  std::ostringstream log;
  EXPECT_THROW(run_training(c, {}, log), UsageError);
}

// Latent shards with cond / cond_len: read with the samples, through the loader.
TEST(SingleStreamData, LatentShardsCarryConditionFeatures) {
  TempDir tmp;
  const int64_t N = 5;
  auto latents = at::randn({N, 2, 4, 4});
  auto cond = at::randn({N, 3, 6}).to(at::kHalf);
  auto len = at::tensor(std::vector<int32_t>{3, 1, 0, 2, 3}, at::kInt);
  io::save_safetensors(tmp.file("a.safetensors"),
                       io::NamedTensors{{"latents", latents}, {"labels", at::tensor(std::vector<int64_t>{0, 1, 2, 0, 1})},
                                        {"cond", cond}, {"cond_len", len}});
  auto ds = data::open_latent_shards(tmp.file("a.safetensors"));
  EXPECT_EQ(ds->cond_shape(), (std::array<int64_t, 2>{3, 6}));
  data::BatchLoader loader(*ds, N, 1);
  const data::Batch b = loader.next();
  ASSERT_TRUE(b.cond.defined());
  for (int64_t i = 0; i < N; ++i) {
    // Find the sample by its latents, then its features and length.
    int64_t k = -1;
    for (int64_t j = 0; j < N; ++j)
      if (b.x[i].equal(latents[j])) k = j;
    ASSERT_GE(k, 0);
    EXPECT_TRUE(b.cond[i].equal(cond[k].to(at::kFloat)));
    EXPECT_EQ(b.cond_len[i].item<int64_t>(), len[k].item<int64_t>());
  }
  // A length beyond Tc, and cond without cond_len, are data errors naming the file.
  io::save_safetensors(tmp.file("b.safetensors"),
                       io::NamedTensors{{"latents", latents}, {"labels", at::tensor(std::vector<int64_t>{0, 1, 2, 0, 1})},
                                        {"cond", cond}, {"cond_len", len + 1}});
  EXPECT_THROW(data::open_latent_shards(tmp.file("b.safetensors")), RuntimeError);
  io::save_safetensors(tmp.file("c.safetensors"),
                       io::NamedTensors{{"latents", latents}, {"labels", at::tensor(std::vector<int64_t>{0, 1, 2, 0, 1})},
                                        {"cond", cond}});
  EXPECT_THROW(data::open_latent_shards(tmp.file("c.safetensors")), RuntimeError);
}

}  // namespace
}  // namespace perftrain::train
