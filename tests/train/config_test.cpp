#include <gtest/gtest.h>

#include "base/error.h"
#include "support/test_support.h"
#include "train/config.h"

#include <stdexcept>
#include <string>
#include <vector>

namespace perftrain::train {
namespace {

using perftrain::testing::error_of;

TEST(TrainConfig, DefaultsAreValidOnBothDevices) {
  EXPECT_NO_THROW(default_config(true).validate());
  EXPECT_NO_THROW(default_config(false).validate());
  EXPECT_EQ(default_config(true).model.name, "DiT-S/2");
  EXPECT_EQ(default_config(true).data.source, "fashion-mnist");
}

TEST(TrainConfig, TomlSetsKeysAndModelNameSetsArchitecture) {
  TrainConfig c = default_config(false);
  apply_toml(c, R"(
[model]
name = "DiT-B/4"
image_size = 16
[train]
lr = 3e-4
steps = 7
ema_warmup = false
[diffusion]
objective = "flow"
)", "test.toml");
  EXPECT_EQ(c.model.depth, 12);
  EXPECT_EQ(c.model.hidden, 768);
  EXPECT_EQ(c.model.patch, 4);
  EXPECT_EQ(c.model.image_size, 16);
  EXPECT_DOUBLE_EQ(c.optim.lr, 3e-4);
  EXPECT_EQ(c.optim.steps, 7);
  EXPECT_FALSE(c.optim.ema_warmup);
  EXPECT_EQ(c.diffusion.objective, "flow");
}

TEST(TrainConfig, ResolvedTomlRoundTrips) {
  TrainConfig a = default_config(true);
  apply_override(a, "train.lr=0.00012345678901234");
  apply_override(a, "run.name=my-run");
  apply_override(a, "model.depth=3");
  EXPECT_FALSE(a.speed.gelu_recompute) << "the default keeps the MLP activations";
  apply_override(a, "speed.gelu_recompute=true");
  TrainConfig b = default_config(false);
  apply_toml(b, a.to_toml(), "roundtrip");
  EXPECT_EQ(a.to_toml(), b.to_toml());
  EXPECT_DOUBLE_EQ(b.optim.lr, 0.00012345678901234);
  EXPECT_EQ(b.run.name, "my-run");
  EXPECT_EQ(b.model.depth, 3);
  EXPECT_TRUE(b.speed.gelu_recompute);
}

TEST(TrainConfig, UnknownKeysSectionsAndWrongTypesAreUsageErrors) {
  TrainConfig c = default_config(false);
  auto msg = error_of<UsageError>([&] { apply_toml(c, "[train]\nbatchsize = 3\n", "cfg.toml"); });
  EXPECT_NE(msg.find("train.batchsize"), std::string::npos) << msg;
  EXPECT_NE(msg.find("batch_size"), std::string::npos) << "should list the known keys: " << msg;
  msg = error_of<UsageError>([&] { apply_toml(c, "[optimizer]\nlr = 3\n", "cfg.toml"); });
  EXPECT_NE(msg.find("[optimizer]"), std::string::npos) << msg;
  for (const char* section : {"[model]", "[data]", "[train]", "[diffusion]", "[log]", "[run]", "[speed]"})
    EXPECT_NE(msg.find(section), std::string::npos) << "should list every section: " << msg;
  msg = error_of<UsageError>([&] { apply_override(c, "sped.attention=whole_head"); });
  EXPECT_NE(msg.find("[speed]"), std::string::npos) << msg;
  msg = error_of<UsageError>([&] { apply_toml(c, "[train]\nsteps = \"many\"\n", "cfg.toml"); });
  EXPECT_NE(msg.find("integer"), std::string::npos) << msg;
  msg = error_of<UsageError>([&] { apply_toml(c, "[train\nsteps = 1\n", "cfg.toml"); });
  EXPECT_NE(msg.find("cfg.toml:1"), std::string::npos) << msg;
  msg = error_of<UsageError>([&] { apply_override(c, "steps=4"); });
  EXPECT_NE(msg.find("section.key=value"), std::string::npos) << msg;
  msg = error_of<UsageError>([&] { apply_override(c, "model.name=DiT-Q/2"); });
  EXPECT_NE(msg.find("DiT-S/2"), std::string::npos) << msg;
}

TEST(TrainConfig, ValidateNamesTheBadValue) {
  auto bad = [](const std::string& override, const std::string& expect) {
    TrainConfig c = default_config(false);
    apply_override(c, override);
    auto msg = error_of<UsageError>([&] { c.validate(); });
    EXPECT_NE(msg.find(expect), std::string::npos) << override << " -> " << msg;
  };
  bad("train.batch_size=0", "batch_size");
  bad("train.lr=-1e-4", "train.lr");
  bad("model.patch=3", "patch 3 does not divide image_size 32");
  bad("data.source=imagenet", "data.source");
  bad("train.device=tpu", "train.device");
  bad("diffusion.objective=score", "diffusion.objective");
  bad("train.steps=0", "train.steps");
}

// The [speed] keys beyond the booleans: their defaults, every allowed value
// through config.toml and back, and a wrong value refused by validate().
TEST(TrainConfig, SpeedKeysRoundTripAndAreValidated) {
  const TrainConfig d = default_config(true);
  EXPECT_EQ(d.speed.attention, "auto");
  EXPECT_EQ(d.speed.weight_grad_stream, "auto");
  EXPECT_EQ(d.speed.gemm_tune, ops::kDefaultGemmTuneCandidates);
  for (const char* attention : {"whole_head", "tiled", "cudnn", "auto"}) {
    for (const char* stream : {"auto", "on", "off"}) {
      for (const char* tune : {"0", "1", "64"}) {
        TrainConfig a = default_config(true);
        apply_override(a, std::string("speed.attention=") + attention);
        apply_override(a, std::string("speed.weight_grad_stream=") + stream);
        apply_override(a, std::string("speed.gemm_tune=") + tune);
        EXPECT_NO_THROW(a.validate());
        TrainConfig b = default_config(false);
        apply_toml(b, a.to_toml(), "roundtrip");
        EXPECT_EQ(b.speed.attention, attention);
        EXPECT_EQ(b.speed.weight_grad_stream, stream);
        EXPECT_EQ(b.speed.gemm_tune, std::stoll(tune));
        EXPECT_EQ(a.to_toml(), b.to_toml());
      }
    }
  }
  auto bad = [](const std::string& override, const std::vector<std::string>& expect) {
    TrainConfig c = default_config(true);
    apply_override(c, override);
    auto msg = error_of<UsageError>([&] { c.validate(); });
    for (const auto& e : expect) EXPECT_NE(msg.find(e), std::string::npos) << override << " -> " << msg;
    // validate_speed (what apply_speed_settings checks) says the same.
    EXPECT_EQ(error_of<UsageError>([&] { validate_speed(c.speed); }), msg);
  };
  bad("speed.attention=flash", {"speed.attention", "'flash'", "whole_head, tiled, cudnn or auto"});
  bad("speed.attention=OWN", {"speed.attention", "whole_head, tiled, cudnn or auto"});
  bad("speed.weight_grad_stream=yes", {"speed.weight_grad_stream", "'yes'", "auto, on or off"});
  bad("speed.gemm_tune=65", {"speed.gemm_tune", "65", "from 0 to 64"});
  bad("speed.gemm_tune=-1", {"speed.gemm_tune", "from 0 to 64"});
  // The wrong type is refused when it is read.
  TrainConfig c = default_config(true);
  auto msg = error_of<UsageError>([&] { apply_override(c, "speed.gemm_tune=eight"); });
  EXPECT_NE(msg.find("speed.gemm_tune must be an integer"), std::string::npos) << msg;
  msg = error_of<UsageError>([&] { apply_toml(c, "[speed]\nattention = true\n", "cfg.toml"); });
  EXPECT_NE(msg.find("speed.attention must be a string (whole_head, tiled, cudnn or auto)"), std::string::npos) << msg;
  msg = error_of<UsageError>([&] { apply_override(c, "speed.weight_grad_stream=1"); });
  EXPECT_NE(msg.find("speed.weight_grad_stream must be a string (auto, on or off)"), std::string::npos) << msg;
}

TEST(TrainConfig, ConfigFieldsListASectionAsConfigTomlWritesIt) {
  TrainConfig c = default_config(true);
  apply_override(c, "speed.attention=cudnn");
  apply_override(c, "speed.gemm_tune=0");
  const auto speed = config_fields(c, "speed");
  std::vector<std::string> keys;
  for (const auto& [k, v] : speed) keys.push_back(k);
  EXPECT_EQ(keys, (std::vector<std::string>{"graph", "fused_kernels", "fused_optimizer", "recompute",
                                            "gelu_recompute", "attention", "weight_grad_stream", "gemm_tune"}));
  EXPECT_EQ(speed[0].second, "true");
  EXPECT_EQ(speed[5].second, "'cudnn'");
  EXPECT_EQ(speed[7].second, "0");
  for (const auto& [k, v] : speed)
    EXPECT_NE(c.to_toml().find(k + " = " + v + "\n"), std::string::npos) << k;
  EXPECT_THROW(config_fields(c, "nonsense"), std::invalid_argument);
}

TEST(TrainConfig, Fp16NeedsTheDeviceOptimizer) {
  // Caught by validate(), before the run directory is made.
  TrainConfig c = default_config(true);
  apply_override(c, "train.precision=fp16");
  c.validate();
  apply_override(c, "speed.fused_optimizer=false");
  auto msg = error_of<UsageError>([&] { c.validate(); });
  EXPECT_NE(msg.find("speed.fused_optimizer"), std::string::npos) << msg;
}

TEST(TrainConfig, FlowWithLearnedSigmaIsRejected) {
  TrainConfig c = default_config(false);
  apply_override(c, "diffusion.objective=flow");
  apply_override(c, "model.learn_sigma=true");
  EXPECT_THROW(c.validate(), UsageError);
}

}  // namespace
}  // namespace perftrain::train
