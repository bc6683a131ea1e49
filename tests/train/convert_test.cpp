// perftrain convert and --init-from as library calls: a DiT-XL/2-shaped
// torch.save state dict converts to perftrain safetensors whose every tensor
// equals the source and which loads into the model its shapes describe; a new
// class count re-initialises the label table only; any other mismatch, or a
// single-stream model to diffusers, is an error naming it.
#include <ATen/ops/zeros.h>
#include <gtest/gtest.h>

#include <sstream>

#include "base/error.h"
#include "io/safetensors.h"
#include "io/torch_pickle.h"
#include "models/diffusion_model.h"
#include "support/test_support.h"
#include "support/torch_files.h"
#include "train/checkpoint.h"
#include "train/convert.h"
#include "train/init_from.h"
#include "train/weights_source.h"

namespace perftrain::train {
namespace {

using perftrain::testing::contains;
using perftrain::testing::error_of;
using perftrain::testing::TempDir;

models::DiTConfig tiny(int64_t num_classes, int64_t hidden = 32) {
  models::DiTConfig c = models::dit_config("DiT-T/4");
  c.depth = 2, c.hidden = hidden, c.heads = 2, c.image_size = 8, c.in_channels = 4, c.num_classes = num_classes;
  return c;
}

// Weights of a model in a safetensors file with its config, as a checkpoint's.
std::string save_model(const models::DiffusionModel& m, const std::string& path) {
  io::save_safetensors(path, m.state(), {{"perftrain.config", config_for_model(m.config()).to_toml()}});
  return path;
}

TEST(Convert, DitXl2ShapedStateDictConvertsAndLoadsEqual) {
  TempDir tmp;
  // DiT-XL/2's width, heads and patch at depth 2 (the whole model would be 2.7 GB): 214 MB of
  // .pt; about 10 s of CPU, most of it Python starting and writing the file.
  const std::string pt = perftrain::testing::make_dit_pt(tmp.path(), 2, 1152, 2, 32, 1000, true);
  ConvertOptions o;
  o.input = pt, o.out = tmp.file("dit.safetensors");
  std::ostringstream log;
  // Depth 2 at width 1152 is no registry model: heads cannot be guessed.
  EXPECT_TRUE(contains(error_of<UsageError>([&] { run_convert(o, log); }), "pass --heads"));
  EXPECT_FALSE(fs::exists(o.out));
  o.hints.model = "DiT-XL/2";
  run_convert(o, log);
  EXPECT_TRUE(contains(log.str(), "model DiT-XL/2: depth 2, hidden 1152, heads 16, patch 2, mlp_ratio 4, image_size 32, "
                                  "in_channels 4, learn_sigma true, num_classes 1000, class_dropout 0.1 (from the shapes)"))
      << log.str();

  const auto source = io::read_torch_state_dict(pt).tensors;
  const auto file = io::SafetensorsFile::open(o.out);
  EXPECT_EQ(file.verify_checksums(), source.size());
  for (const auto& [name, t] : source) EXPECT_TRUE(file.get(name).equal(t)) << name;
  // The file loads into the model its config describes, tensor for tensor.
  const TrainConfig cfg = config_from_weights(o.out);
  EXPECT_EQ(cfg.model.depth, 2);
  EXPECT_EQ(cfg.model.heads, 16);
  const auto model = models::make_diffusion_model(cfg.model, /*seed=*/7);
  load_weights(o.out, *model);
  EXPECT_EQ(model->state().size(), source.size());
  for (const auto& [name, t] : model->state()) {
    bool found = false;
    for (const auto& [n, s] : source) {
      if (n != name) continue;
      found = true;
      EXPECT_TRUE(t.equal(s)) << name;
    }
    EXPECT_TRUE(found) << name;
  }
}

TEST(Convert, SingleStreamToDiffusersIsRefusedAndNothingWritten) {
  TempDir tmp;
  models::DiTConfig c = models::model_config("SS-T/2");
  c.depth = 1, c.hidden = 32, c.heads = 2, c.image_size = 8, c.in_channels = 4;
  const auto m = models::make_diffusion_model(c, 0);
  ConvertOptions o;
  o.input = save_model(*m, tmp.file("ss.safetensors")), o.out = tmp.file("out"), o.to = "diffusers";
  std::ostringstream log;
  const std::string msg = error_of<UsageError>([&] { run_convert(o, log); });
  EXPECT_TRUE(contains(msg, "single-stream family, which diffusers has no class for")) << msg;
  EXPECT_EQ(tmp.entries().size(), 1u);  // ss.safetensors only
  o.to = "onnx";
  EXPECT_TRUE(contains(error_of<UsageError>([&] { run_convert(o, log); }), "--to 'onnx': expected one of perftrain, diffusers"));
}

TEST(InitFrom, NewClassCountReinitialisesOnlyTheLabelTable) {
  TempDir tmp;
  const auto source = models::make_diffusion_model(tiny(10), 1);
  const std::string path = save_model(*source, tmp.file("w.safetensors"));
  auto model = models::make_diffusion_model(tiny(4), 2), ema = models::make_diffusion_model(tiny(4), 3);
  const auto fresh = models::make_diffusion_model(tiny(4), 2);
  const std::string line = init_from_weights(path, *model, *ema);
  EXPECT_TRUE(contains(line, "initialised from " + path + ": loaded ")) << line;
  EXPECT_TRUE(contains(line, "re-initialised y_embedder.embedding_table.weight ([11, 32] in the weights, [5, 32] here"))
      << line;
  const auto from = source->state(), got = model->state(), own = fresh->state(), averaged = ema->state();
  for (size_t i = 0; i < got.size(); ++i) {
    const std::string& name = got[i].first;
    const at::Tensor& want = name == "y_embedder.embedding_table.weight" ? own[i].second : from[i].second;
    EXPECT_TRUE(got[i].second.equal(want)) << name;
    EXPECT_TRUE(averaged[i].second.equal(got[i].second)) << name;  // the EMA starts at the weights
  }
}

TEST(InitFrom, OtherShapeMismatchIsAnErrorNamingTheKeyAndLoadsNothing) {
  TempDir tmp;
  const auto source = models::make_diffusion_model(tiny(10, 64), 1);
  const std::string path = save_model(*source, tmp.file("w.safetensors"));
  auto model = models::make_diffusion_model(tiny(10, 32), 2), ema = models::make_diffusion_model(tiny(10, 32), 2);
  const auto fresh = models::make_diffusion_model(tiny(10, 32), 2);
  const std::string msg = error_of<UsageError>([&] { init_from_weights(path, *model, *ema); });
  EXPECT_TRUE(contains(msg, path + ": the weights do not fit model DiT-T/4: ")) << msg;
  EXPECT_TRUE(contains(msg, "of another shape (first 'x_embedder.proj.weight'): 'x_embedder.proj.weight' is [64, 4, 4, 4] "
                            "in the weights, [32, 4, 4, 4] here"))
      << msg;
  for (size_t i = 0; i < model->state().size(); ++i)
    EXPECT_TRUE(model->state()[i].second.equal(fresh->state()[i].second)) << model->state()[i].first;
}

TEST(InitFrom, MissingAndUnexpectedTensorsAreCounted) {
  io::NamedTensors source = models::make_diffusion_model(tiny(10), 1)->state();
  for (auto it = source.begin(); it != source.end(); ++it)
    if (it->first == "t_embedder.mlp.0.weight") {
      source.erase(it);
      break;
    }
  source.emplace_back("extra.weight", at::zeros({2}));
  auto model = models::make_diffusion_model(tiny(10), 2);
  const std::string msg = error_of<UsageError>([&] { load_named_weights(source, *model, true, "w"); });
  EXPECT_TRUE(contains(msg, "1 missing (first 't_embedder.mlp.0.weight')")) << msg;
  EXPECT_TRUE(contains(msg, "1 unexpected (first 'extra.weight')")) << msg;
}

}  // namespace
}  // namespace perftrain::train
