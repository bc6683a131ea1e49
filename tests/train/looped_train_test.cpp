// The looped DiT through the generic training path on the CPU: the model.*
// keys (model.loops sets the depth of block applications; bad values name
// their key), the loss falling with LoRA and routing, the routers' auxiliary
// loss in the loss and in metrics.jsonl, a checkpoint round-trip, and a
// resumed run bit-identical to an uninterrupted one.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "base/error.h"
#include "io/safetensors.h"
#include "models/diffusion_model.h"
#include "support/run_checks.h"
#include "support/test_support.h"
#include "train/checkpoint.h"
#include "train/trainer.h"

namespace perftrain::train {
namespace {

using perftrain::testing::expect_resume_bit_identical;
using perftrain::testing::metrics_lines;
using perftrain::testing::TempDir;

// Looped-T/2 at 32 wide: prelude 1, one shared block x 3 loops with rank-4
// adapters, loops 1 and 2 routed (capacity 1 -> 0.5), coda 1.
TrainConfig tiny_looped(const std::string& runs, const std::string& name, int64_t steps) {
  TrainConfig c = default_config(false);
  for (const char* o : {"model.name=Looped-T/2", "model.hidden=32", "model.heads=2", "model.image_size=8",
                        "model.in_channels=2", "model.num_classes=3", "model.prelude=1", "model.coda=1",
                        "model.loops=3", "model.lora_rank=4", "model.route_capacity_end=0.5",
                        "model.router_aux_weight=0.1", "data.source=synthetic", "data.synthetic_size=40",
                        "train.batch_size=8", "train.lr=3e-3", "train.warmup_steps=3", "train.grad_clip=1.0",
                        "train.device=cpu", "log.every=2", "log.checkpoint_every=3", "log.sample_every=0",
                        "diffusion.objective=ddpm", "model.learn_sigma=false", "diffusion.sample_steps=2",
                        "log.sample_per_class=2"})
    apply_override(c, o);
  c.optim.steps = steps;
  c.run.dir = runs;
  c.run.name = name;
  return c;
}

std::string usage_error(TrainConfig c, const std::string& assignment) {
  try {
    apply_override(c, assignment);
    c.validate();
  } catch (const UsageError& e) {
    return e.what();
  }
  return "no error";
}

TEST(LoopedConfigKeys, LoopsSetTheDepthAndBadValuesNameTheirKey) {
  TrainConfig c = default_config(false);
  apply_override(c, "model.name=Looped-B/2");
  EXPECT_EQ(c.model.family, "looped");
  EXPECT_EQ(c.model.depth, 12);
  apply_override(c, "model.loops=4");
  EXPECT_EQ(c.model.depth, 8);
  apply_override(c, "model.shared_group=2");
  EXPECT_EQ(c.model.depth, 12);
  EXPECT_NO_THROW(c.validate());
  // Naming a model resets the loop structure to the name's.
  apply_override(c, "model.name=Looped-S/4");
  EXPECT_EQ(c.model.loops, 8);
  EXPECT_EQ(c.model.shared_group, 1);
  // The resolved config reads back to the same model.
  TrainConfig back = default_config(false);
  apply_override(c, "model.lora_targets=attn,adaln");
  apply_override(c, "model.route_capacity=0.25");
  apply_toml(back, c.to_toml(), "config.toml");
  EXPECT_EQ(back.model.depth, c.model.depth);
  EXPECT_EQ(back.model.lora_targets, "attn,adaln");
  EXPECT_EQ(back.model.route_capacity, 0.25);

  EXPECT_NE(usage_error(c, "model.loops=0").find("model.loops 0"), std::string::npos);
  EXPECT_NE(usage_error(c, "model.reinject=mul").find("model.reinject"), std::string::npos);
  EXPECT_NE(usage_error(c, "model.loop_block=mmdit").find("model.loop_block"), std::string::npos);
  EXPECT_NE(usage_error(c, "model.lora_targets=attn,q").find("model.lora_targets"), std::string::npos);
  EXPECT_NE(usage_error(c, "model.route_capacity=0").find("model.route_capacity"), std::string::npos);
  EXPECT_NE(usage_error(c, "model.lora_rank=-1").find("model.lora_rank"), std::string::npos);
  EXPECT_NE(usage_error(c, "model.lora_bias=3").find("model.lora_bias must be a boolean"), std::string::npos);
  EXPECT_NE(usage_error(c, "model.depth=5").find("model.depth 5"), std::string::npos);
}

// The eps-prediction MSE starts at 1 (the zero-initialised output); the
// class patterns of the synthetic data bring it well below within 60 steps
// when the loops, adapters and routers train.
TEST(LoopedTraining, LossFallsWithLoRAAndRoutingAndTheAuxLossIsLogged) {
  TempDir tmp;
  std::ostringstream log;
  const TrainConfig c = tiny_looped(tmp.path(), "run", 60);
  const auto s = run_training(c, {}, log);
  EXPECT_LT(s.final_loss, 0.6 * s.first_loss) << log.str();
  const auto lines = metrics_lines(tmp.path() + "/run");
  ASSERT_FALSE(lines.empty());
  for (const auto& rec : lines) {
    ASSERT_TRUE(rec.contains("aux")) << rec.dump();
    const double aux = rec["aux"].get<double>();
    EXPECT_GT(aux, 0) << rec.dump();
    EXPECT_LT(aux, 0.1) << rec.dump();  // router_aux_weight 0.1 x a BCE near log 2
    EXPECT_LT(aux, rec["loss"].get<double>()) << rec.dump();
  }
  // The checkpoint loads into a model built from its own config.
  const std::string w = s.last_checkpoint + "/model.safetensors";
  const TrainConfig back = config_from_weights(w);
  EXPECT_EQ(back.model.family, "looped");
  EXPECT_EQ(back.model.loops, 3);
  EXPECT_EQ(back.model.lora_rank, 4);
  auto m = models::make_diffusion_model(back.model, 99);
  load_weights(w, *m);
  auto file = io::SafetensorsFile::open(w);
  for (const auto& [name, t] : m->state()) EXPECT_TRUE(t.equal(file.get(name))) << name;
  EXPECT_TRUE(file.contains("adapters.2.0.attn.qkv.lora_B"));
  EXPECT_TRUE(file.contains("routers.2.weight"));
  EXPECT_GT(file.get("adapters.2.0.attn.qkv.lora_B").abs().max().item<double>(), 0);  // trained from zero
}

TEST(LoopedTraining, ResumedRunIsBitIdenticalToAnUninterruptedOne) {
  TempDir tmp;
  std::ostringstream log;
  const int64_t n = 5;
  expect_resume_bit_identical(
      [&](const std::string& name, int64_t steps) { return tiny_looped(tmp.path(), name, steps); }, tmp.path(), n,
      log);
}

}  // namespace
}  // namespace perftrain::train
