// perftrain extract in process (train/extract.h): a generated image folder
// through a tiny random VAE into latent shards, read back by the trainer's
// dataset and trained on for two steps; the same settings give the same
// shards; an --out of other settings and a bad --vae are refused with
// nothing written; a latent model evaluated through the VAE, by the
// Evaluator and by eval.every with eval.vae inside training. The
// kill-and-rerun test is tests/cli/extract_cli_test.cpp.
#include <ATen/TensorOperators.h>
#include <gtest/gtest.h>

#include <initializer_list>
#include <nlohmann/json.hpp>
#include <sstream>

#include "base/error.h"
#include "data/adm_crop.h"
#include "data/dataset.h"
#include "data/image_file.h"
#include "models/diffusion_model.h"
#include "io/safetensors.h"
#include "support/image_files.h"
#include "support/test_support.h"
#include "support/vae_folder.h"
#include "train/eval/evaluation.h"
#include "train/eval/feature_net_training.h"
#include "train/extract.h"
#include "train/trainer.h"
#include "train/vae.h"

namespace perftrain::train {
namespace {

using perftrain::testing::contains;
using perftrain::testing::error_of;
using perftrain::testing::TempDir;

ExtractOptions options(const TempDir& tmp, const std::string& out) {
  ExtractOptions o;
  o.data_path = tmp.file("images");
  o.vae = tmp.file("vae");
  o.out = tmp.file(out);
  o.image_size = 32;
  o.batch_size = 3;
  o.shard_size = 4;
  o.flip = true;
  o.device = "cpu";
  return o;
}

// A tiny DiT of the extracted latents (4 x 16 x 16, 2 classes), two steps on the CPU.
TrainConfig tiny_latent_run(const TempDir& tmp, const std::string& name) {
  TrainConfig c = default_config(false);
  for (const char* o : {"model.depth=1", "model.hidden=32", "model.heads=2", "model.patch=4", "model.image_size=16",
                        "model.in_channels=4", "model.num_classes=2", "data.source=latents", "train.batch_size=4",
                        "train.device=cpu", "log.every=1", "log.checkpoint_every=0", "log.sample_every=0",
                        "diffusion.sample_steps=1", "model.learn_sigma=false", "diffusion.objective=flow"})
    apply_override(c, o);
  c.data.path = tmp.file("latents");
  c.optim.steps = 2;
  c.run.dir = tmp.path();
  c.run.name = name;
  return c;
}

void make_inputs(const TempDir& tmp) {
  perftrain::testing::write_image_folder(tmp.file("images"), {"class0", "class1"}, 3);  // 9 to 31 px
  perftrain::testing::write_random_vae(tmp.file("vae"));
}

// The generated images extracted into tmp/latents, and tiny_latent_run("run")
// over them with the overrides applied.
TrainConfig extracted_latent_run(const TempDir& tmp, std::ostream& log, std::initializer_list<const char*> overrides) {
  make_inputs(tmp);
  run_extract(options(tmp, "latents"), log, false);
  TrainConfig c = tiny_latent_run(tmp, "run");
  for (const char* o : overrides) apply_override(c, o);
  return c;
}

TEST(Extract, ImageFolderToShardsTheTrainerReads) {
  TempDir tmp;
  make_inputs(tmp);
  std::ostringstream log;
  const ExtractResult r = run_extract(options(tmp, "latents"), log, false);
  EXPECT_EQ(r.samples, 12);  // 6 images and their flipped copies
  EXPECT_EQ(r.shards, 3);
  EXPECT_EQ(r.shards_kept, 0);
  EXPECT_TRUE(contains(log.str(), "12/12 latents")) << log.str();

  const auto ds = data::open_latent_shards(tmp.file("latents"));
  ASSERT_EQ(ds->size(), 12);
  EXPECT_EQ(ds->sample_shape(), (std::array<int64_t, 3>{4, 16, 16}));
  EXPECT_EQ(ds->num_classes(), 2);
  const auto shard0 = io::SafetensorsFile::open(tmp.file("latents/latents-000000.safetensors"));
  EXPECT_EQ(shard0.metadata().at(kShardScalingFactor), "0.5");
  EXPECT_EQ(shard0.metadata().at("image_size"), "32");
  EXPECT_EQ(shard0.metadata().at("flip"), "true");
  std::vector<int64_t> labels(12);
  std::vector<float> x(12 * 4 * 16 * 16);
  std::vector<int64_t> all(12);
  for (int64_t i = 0; i < 12; ++i) all[i] = i;
  ds->gather(all.data(), 12, x.data(), labels.data());
  EXPECT_EQ(labels, (std::vector<int64_t>{0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1}));

  // Sample 0 is a posterior sample of class0/0.png times the scale; sample 1
  // one of the same image flipped: each within 6 standard deviations of its
  // own posterior's mean, and the two means differ.
  const Vae vae = load_vae(tmp.file("vae"), at::kCPU, false);
  const at::Tensor img = (data::adm_center_crop(data::read_image_file(tmp.file("images/class0/0.png")), 32)
                             .permute({2, 0, 1}).to(at::kFloat).unsqueeze(0) / 255.0f - 0.5f) / 0.5f;
  const at::Tensor latents = at::from_blob(x.data(), {12, 4, 16, 16}, at::kFloat);
  for (int flip = 0; flip < 2; ++flip) {
    const auto post = vae.net->encode(flip ? img.flip({3}) : img);
    const at::Tensor z = latents[flip] / 0.5;
    const at::Tensor sd = (0.5 * post.logvar).exp();
    EXPECT_LT(((z - post.mean[0]).abs() / sd[0]).max().item<double>(), 6.0) << flip;
  }
  EXPECT_GT((vae.net->encode(img).mean - vae.net->encode(img.flip({3})).mean).abs().max().item<double>(), 1e-3);

  // The same settings into another folder: the same bytes.
  run_extract(options(tmp, "again"), log, false);
  for (int s = 0; s < 3; ++s) {
    const std::string name = "/latents-00000" + std::to_string(s) + ".safetensors";
    EXPECT_EQ(perftrain::testing::read_raw(tmp.file("latents") + name), perftrain::testing::read_raw(tmp.file("again") + name));
  }

  // Two training steps on the shards.
  const TrainSummary t = run_training(tiny_latent_run(tmp, "run"), {}, log);
  EXPECT_EQ(t.last_step, 2);
  EXPECT_TRUE(std::isfinite(t.final_loss));
}

TEST(Extract, AnOutOfOtherSettingsIsRefused) {
  TempDir tmp;
  make_inputs(tmp);
  std::ostringstream log;
  run_extract(options(tmp, "latents"), log, false);
  ExtractOptions o = options(tmp, "latents");
  o.image_size = 16;
  std::string msg = error_of<UsageError>([&] { run_extract(o, log, false); });
  EXPECT_TRUE(contains(msg, "holds shards of other settings") && contains(msg, "image_size 32, this run 16")) << msg;
  o = options(tmp, "latents");
  o.flip = false;
  msg = error_of<UsageError>([&] { run_extract(o, log, false); });
  EXPECT_TRUE(contains(msg, "flip true, this run false")) << msg;
  // The same settings: all kept, nothing to do.
  const ExtractResult again = run_extract(options(tmp, "latents"), log, false);
  EXPECT_EQ(again.shards_kept, 3);
}

TEST(Extract, ABadVaeFolderIsRefusedBeforeAnythingIsWritten) {
  TempDir tmp;
  make_inputs(tmp);
  std::ostringstream log;
  ExtractOptions o = options(tmp, "latents");
  o.vae = tmp.file("images");  // a folder, but not a VAE's
  std::string msg = error_of<UsageError>([&] { run_extract(o, log, false); });
  EXPECT_TRUE(contains(msg, "--vae " + tmp.file("images") + " has no config.json")) << msg;
  EXPECT_FALSE(fs::exists(tmp.file("latents")));
  o = options(tmp, "latents");
  o.image_size = 31;  // not a multiple of the VAE's 2x downsampling
  msg = error_of<UsageError>([&] { run_extract(o, log, false); });
  EXPECT_TRUE(contains(msg, "--image-size 31 is not a multiple")) << msg;
  EXPECT_FALSE(fs::exists(tmp.file("latents")));
}

// eval of a latent model: refused without a decoder; with the VAE's, its
// samples are 3-channel 32 px images that go through a feature network of
// that shape (trained here on synthetic images for the purpose).
TEST(Extract, EvalDecodesALatentModelThroughTheVae) {
  TempDir tmp;
  std::ostringstream log;
  TrainConfig c = extracted_latent_run(tmp, log, {"eval.every=2", "eval.samples=4"});
  const auto model = models::build_diffusion_model(c.model, 0, at::kCPU);

  const auto images = data::make_synthetic(64, {3, 32, 32}, 2, 1);
  eval::FeatureNetTraining t;
  t.batch_size = 32;
  eval::train_feature_net(*images, nullptr, tmp.file("features.safetensors"), t, at::kCPU, log);
  eval::EvalOptions o;
  o.features = tmp.file("features.safetensors");
  o.samples = 10;
  o.batch_size = 5;
  o.sample.steps = 1;
  o.sample.cfg_scale = 1.0;
  const eval::Evaluator without(o, at::kCPU);
  EXPECT_TRUE(contains(error_of<UsageError>([&] { without.check_model(c); }), "needs their VAE: --vae DIR"));

  o.sample.decoder = vae_image_decoder(tmp.file("vae"), c, at::kCPU, log);
  EXPECT_TRUE(contains(log.str(), "latents / 0.5 + 0 (from the run's latent shards")) << log.str();
  EXPECT_EQ(image_size_of(c, o.sample), 32);
  const eval::Evaluator with(o, at::kCPU);
  const eval::Metrics m = with.run(*model, c);
  ASSERT_EQ(m.size(), 2u);
  EXPECT_EQ(m[0].first, "fd_features");
  EXPECT_TRUE(std::isfinite(m[0].second) && m[0].second >= 0) << m[0].second;

  // Inside training: eval.vae decodes, eval.every's lines in metrics.jsonl.
  c.eval.features = tmp.file("features.safetensors");
  EXPECT_TRUE(contains(error_of<UsageError>([&] { run_training(c, {}, log); }), "(eval.vae in training)"));
  c.eval.vae = tmp.file("vae");
  c.run.name = "run2";
  run_training(c, {}, log);
  std::istringstream metrics(perftrain::testing::read_raw(tmp.file("run2/metrics.jsonl")));
  int evals = 0;
  for (std::string line; std::getline(metrics, line);) {
    const auto j = nlohmann::json::parse(line);
    if (!j.contains("eval")) continue;
    ++evals;
    EXPECT_EQ(j["step"].get<int64_t>(), 2);
    EXPECT_GE(j["eval"]["fd_features"].get<double>(), 0.0);
  }
  EXPECT_EQ(evals, 1);

  // The VAE's latent channels must be the model's.
  apply_override(c, "model.in_channels=3");
  EXPECT_TRUE(contains(error_of<UsageError>([&] { vae_image_decoder(tmp.file("vae"), c, at::kCPU, log); }),
                       "its latents have 4 channels, the model makes 3"));
}


// A PNG's width and height from its IHDR chunk (bytes 16-23, big-endian).
std::pair<int64_t, int64_t> png_size(const std::string& path) {
  const std::string b = perftrain::testing::read_raw(path);
  const auto be32 = [&](size_t at) {
    int64_t v = 0;
    for (size_t i = 0; i < 4; ++i) v = v * 256 + static_cast<unsigned char>(b.at(at + i));
    return v;
  };
  return {be32(16), be32(20)};
}

// A latent run's sample grids: with eval.vae (eval.every off) the samples go
// through the VAE's decoder, 32 px images from 16 px latents; without, the
// grid shows the latents' first channels at 16 px.
TEST(Extract, SampleGridsOfALatentRunAreDecodedWithEvalVae) {
  TempDir tmp;
  std::ostringstream log;
  TrainConfig c = extracted_latent_run(tmp, log, {"log.sample_every=2", "log.sample_classes=2",
                                                  "log.sample_per_class=3"});
  c.run.name = "raw";
  const TrainSummary raw = run_training(c, {}, log);
  ASSERT_FALSE(raw.last_samples.empty());
  const auto [raw_w, raw_h] = png_size(raw.last_samples);
  EXPECT_EQ(raw_w, 3 * (16 + 2) + 2);
  EXPECT_EQ(raw_h, 2 * (16 + 2) + 2);

  c.run.name = "decoded";
  c.eval.vae = tmp.file("vae");
  const TrainSummary decoded = run_training(c, {}, log);
  const auto [w, h] = png_size(decoded.last_samples);
  EXPECT_EQ(w, 3 * (32 + 2) + 2);
  EXPECT_EQ(h, 2 * (32 + 2) + 2);
}

}  // namespace
}  // namespace perftrain::train
